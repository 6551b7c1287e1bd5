"""Print the table of the Hugging Face families that load and save (model/hf/families/'s
FAMILIES), as README.md's models section holds it:

    python scripts/hf/models_table.py

tests/project/test_docs.py fails where README.md's table is not this output: paste it there after
adding a family.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from model.hf.families import models_table  # noqa: E402

if __name__ == "__main__":
    print(models_table())
