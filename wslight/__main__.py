"""`python -m wslight <verb> ...`: the verb table of `wslight.app.verbs` (fit, validate, test, evaluate, reproduce)."""

import sys

from .app.verbs import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m wslight"))
