"""``python -m memstore.cli``: the ``memstore`` command, for a checkout without the console script."""

from memstore.cli import main

if __name__ == "__main__":
    main(prog_name="memstore")
