"""``memstore import`` and ``export``: DeerFlow-style memory trees in and out of storage."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from memstore.cli.exit_codes import EXIT_INVALID_ITEMS
from memstore.cli.output import CliError, progress, user_id_option
from memstore.cli.params import TENANT_OPTION, agent_name_option, strict_user_id
from memstore.errors import MemstoreError
from memstore.ops.embeddings import count_missing
from memstore.ops.transfer import (
    ImportEmbedding,
    ImportReport,
    embed_imported,
    export_scopes,
    import_entries,
    import_model,
)
from memstore.ops.view import one_line
from memstore.queries import list_scopes
from memstore.scope import resolve_scope
from memstore.storage.base import MemoryStorage
from memstore.storage.file.layout import TreeEntry, discover_tree, other_json_files
from memstore.storage.loader import get_memory_storage


@click.command("import")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--user",
    "user_id",
    callback=strict_user_id,
    help="Scope for a single-file import (default: the legacy global scope).",
)
@click.option(
    "--agent", "agent_name", callback=agent_name_option, help="Agent scope for a single-file import."
)
@TENANT_OPTION
@click.option("--dry-run", is_flag=True, help="Report what would change without writing.")
@click.option(
    "--no-embed",
    "no_embed",
    is_flag=True,
    help="Do not embed the imported facts (run `memstore embed` later).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def import_command(
    path: Path,
    user_id: str | None,
    agent_name: str | None,
    tenant_id: str | None,
    dry_run: bool,
    no_embed: bool,
    as_json: bool,
) -> None:
    """Import PATH: a memory tree (users/<u>/[agents/<a>/]memory.json, legacy files) or one JSON file.

    Idempotent: documents equal to what is stored are reported unchanged and not written.
    Exits 3 when some items were invalid (the valid ones are still imported). Other JSON files in
    a tree (users/alice.json) are listed as skipped; import such a file on its own with --user.

    Then the facts of the imported scopes that have no vector are embedded with the configured
    embedding_provider, with a progress bar (not with --no-embed or --dry-run). When that fails
    the import stays committed, the command exits 1, and `memstore embed` finishes the job.
    """
    misplaced: list[tuple[Path, str]] = []
    skipped: list[tuple[Path, str]] = []
    if path.is_file():
        user, agent = resolve_scope(agent_name, user_id)
        entries = [TreeEntry(path, user, agent)]
    else:
        if user_id or agent_name:
            raise click.UsageError("--user/--agent apply to a single file, not to a tree")
        entries, misplaced = discover_tree(path)
        skipped = other_json_files(path)
    storage = get_memory_storage().for_identity(tenant_id)
    embed = not (no_embed or dry_run)
    model = import_model(storage) if embed else None  # a setting that cannot embed fails before writing
    with progress("Importing", len(entries)) as advance:
        report = import_entries(
            storage, entries, dry_run=dry_run, on_item=lambda _entry: advance(1), embed=False
        )
    report.invalid.extend(misplaced)
    report.skipped.extend(skipped)
    if embed:
        report.embedding = _embed(storage, report, model)
    _print_report(report, dry_run=dry_run, as_json=as_json)
    failed = report.embedding.error if report.embedding is not None else None
    if failed is not None:
        raise CliError(
            f"the import is committed, but embedding its facts failed: {one_line(failed)}; "
            "run `memstore embed` to finish"
        )
    if report.invalid:
        sys.exit(EXIT_INVALID_ITEMS)


def _embed(storage: MemoryStorage, report: ImportReport, model: str | None) -> ImportEmbedding:
    """Embed what the import's scopes lack, with a bar once the count is known (none: nothing to do)."""
    if model is None:
        if report.imported:
            click.echo("embedding_provider is none: the imported facts are not embedded", err=True)
        return ImportEmbedding(None)
    try:
        total = count_missing(report.scopes, storage=storage)
    except MemstoreError as exc:
        return ImportEmbedding(model, 0, str(exc))
    if total == 0:
        return ImportEmbedding(model)
    with progress(f"Embedding {total} fact(s)", total) as advance:
        return embed_imported(storage, report.scopes, progress=advance)


@click.command("export")
@click.argument("destination", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--user",
    "user_id",
    callback=user_id_option,
    help="Export only this user's scopes (default: every scope).",
)
@TENANT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the written files as JSON.")
def export_command(destination: Path, user_id: str | None, tenant_id: str | None, as_json: bool) -> None:
    """Write stored memory to DESTINATION in the tree layout ``memstore import`` reads.

    Existing files for the exported scopes are overwritten; importing the tree again changes nothing.
    """
    storage = get_memory_storage().for_identity(tenant_id)
    scopes = list_scopes(user_id, storage=storage)
    written: list[Path] = []
    with progress("Exporting", len(scopes)) as advance:
        for scope in scopes:
            written.extend(export_scopes(storage, [scope], destination))
            advance(1)
    if as_json:
        click.echo(
            json.dumps({"destination": str(destination), "files": [str(p) for p in written]}, indent=2)
        )
    else:
        click.echo(f"exported {len(written)} scope(s) to {destination}")


def _print_report(report: ImportReport, *, dry_run: bool, as_json: bool) -> None:
    if as_json:
        summary = {
            "dry_run": dry_run,
            "imported": [str(entry.path) for entry in report.imported],
            "unchanged": len(report.unchanged),
            "invalid": [{"path": str(path), "reason": reason} for path, reason in report.invalid],
            "skipped": [{"path": str(path), "reason": reason} for path, reason in report.skipped],
            "embedding": None if report.embedding is None else report.embedding.to_json(),
        }
        click.echo(json.dumps(summary, ensure_ascii=False, indent=2))
        return
    verb = "would import" if dry_run else "imported"
    click.echo(
        f"{verb}: {len(report.imported)}  unchanged: {len(report.unchanged)}  "
        f"invalid: {len(report.invalid)}  skipped: {len(report.skipped)}"
    )
    for path, reason in report.invalid:
        click.echo(f"  invalid {one_line(str(path))}: {one_line(reason)}")
    for path, reason in report.skipped:
        click.echo(f"  skipped {one_line(str(path))}: {one_line(reason)}")
    if report.skipped:
        click.echo("  (to import a skipped file: memstore import FILE --user USER [--agent AGENT])")
    embedding = report.embedding
    if embedding is not None and embedding.model is not None:
        click.echo(f"embedded: {embedding.embedded} fact(s) with {one_line(embedding.model)}")
