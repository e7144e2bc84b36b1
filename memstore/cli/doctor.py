"""``memstore doctor``: check the setup, one line per part, exit 6 when a part fails."""

from __future__ import annotations

from dataclasses import asdict

import click

from memstore.cli.exit_codes import EXIT_DOCTOR_FAILED
from memstore.cli.output import echo_json
from memstore.ops.doctor import diagnose


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
def doctor(as_json: bool) -> None:
    """Check the database URL, schema, queue, LLM and embeddings endpoints and token encoding."""
    findings = diagnose()
    if as_json:
        echo_json([asdict(finding) for finding in findings])
    else:
        for finding in findings:
            click.echo(f"{finding.verdict:<5} {finding.part:<11} {finding.detail}")
    if any(finding.verdict == "fail" for finding in findings):
        raise SystemExit(EXIT_DOCTOR_FAILED)
