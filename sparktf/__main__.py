"""``python -m sparktf``: the ``sparktf`` command (:mod:`sparktf.console`)."""

from sparktf.console import run

if __name__ == "__main__":
    run()
