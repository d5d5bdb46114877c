"""Export formats (layer 0: pure, over schema): `hermes` is the toolkit's ChatML + Hermes chat
template, `chat` turns OpenAI messages into chat-template rows (dict arguments) and rows into the
openai / sharegpt / hermes export formats."""
