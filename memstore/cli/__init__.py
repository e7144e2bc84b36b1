"""The ``memstore`` command line: one module per command group, registered here."""

from __future__ import annotations

import logging

import click

from memstore import __name__ as _package


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level to stderr.")
def main(verbose: bool) -> None:
    """memstore: long-term memory for LLM agent gateways, kept in SQL."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger(_package).setLevel(logging.INFO if verbose else logging.WARNING)
