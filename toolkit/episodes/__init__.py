"""The episode engine: agent x user simulator x environment, below the commands.

    text         the messages and prompts an episode is made of (agent system prompt, opening
                 message, the user simulator's scenario and prompt, the agent's view)
    agents       LLMAgent, ReplayAgent (the task's reference actions)
    users        the LLM user simulator and the registered ones (`rollout --user-simulator`)
    loop         run_episode: one episode, its limits and termination reasons
    distractors  irrelevant tools mixed into the agent's list (`rollout --distractor-mode`)
    runner       EpisodeRunner: `rollout`'s n episodes per record from the typed RolloutOptions

Used by `rollout` (toolkit.stages.rollout), `eval-tau2`, GRPO's rollouts (toolkit.train.grpo),
the SFT export (toolkit.train.export), the trainer integrations and the flows (LOGIGEN's LLM
explorer, ASTRA's distractor bands) alike. Import from the module that holds a name
(`from toolkit.episodes.loop import run_episode`): the package itself imports nothing, so the
registered user simulators and distractor sources (plugin modules of this package) load without the
LLM client.
"""
