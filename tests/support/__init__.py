"""What the tests share: references, cases, fakes of external services and the programs they
start. The tests themselves sit in one folder a package (tests/parallel/, tests/model/, ...);
none imports another test module, only these."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
FIXTURES = os.path.join(ROOT, "tests", "fixtures")  # made by scripts/hf/make_fixtures.py and kin
