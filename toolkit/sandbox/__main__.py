"""`python -m toolkit.sandbox`: print the isolation report."""

import json

from toolkit.sandbox import isolation_report

print(json.dumps(isolation_report(), indent=2))
