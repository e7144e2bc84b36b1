"""``memstore embed``: embed the facts that have no vector, or all of them after a model change."""

from __future__ import annotations

import click

from memstore.cli.output import echo_json, progress
from memstore.errors import ConfigError
from memstore.ops.embeddings import NO_EMBEDDINGS, EmbeddingReport, embed_facts, embedding_report


@click.command("embed")
@click.option(
    "--rebuild", is_flag=True, help="Re-embed every live fact (after changing the embedding model)."
)
@click.option("--status", "status_only", is_flag=True, help="Report what is embedded; embed nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def embed(rebuild: bool, status_only: bool, as_json: bool) -> None:
    """Embed live facts with the configured embedding_provider, with a progress bar.

    Without --rebuild only facts with no valid vector under the configured model are embedded
    (new, edited, or made by another model). --status reports counts and the search backend,
    and says so when embeddings are off.
    """
    if rebuild and status_only:
        raise click.UsageError("--status embeds nothing, --rebuild re-embeds every fact: choose one")
    report = embedding_report()
    if not status_only:
        if report.model is None or report.status is None:  # with a model there are always vectors
            raise ConfigError(NO_EMBEDDINGS)
        total = report.status.live_facts if rebuild else report.status.missing(report.model)
        with progress("Embedding facts", total) as advance:
            embed_facts(rebuild=rebuild, progress=advance)
        report = embedding_report()
    if as_json:
        echo_json(report.to_json())
    else:
        _print(report)


def _print(report: EmbeddingReport) -> None:
    status = report.status
    if report.model is None:
        click.echo("model:      none (embedding_provider is none: set it to openai or local to embed facts)")
    else:
        click.echo(f"model:      {report.model}")
    if status is None:
        click.echo("backend:    none (this storage provider keeps no vectors)")
        return
    click.echo(f"backend:    {status.backend} (cross-scope semantic search)")
    click.echo(f"live facts: {status.live_facts}")
    if report.model is None:
        for model, count in sorted(report.other_models.items()):
            click.echo(f"unused:     {count} vector(s) by {model}, kept for when embeddings are on again")
        return
    click.echo(f"embedded:   {report.embedded}")
    click.echo(f"missing:    {report.missing}")
    for model, count in sorted(report.other_models.items()):
        click.echo(f"stale:      {count} vector(s) by {model}: run `memstore embed --rebuild`")
