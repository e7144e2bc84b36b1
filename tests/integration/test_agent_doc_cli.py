"""``memstore agent-doc`` through the real console entry point (issue 34), on SQLite and PostgreSQL:
import of a deepagents-style folder (``<agent>/agent.md``), export and its round trip, ``edit``
with a real ``$EDITOR`` (a script, run by click as any editor), a conflicting edit that loses
nothing, ``show``, ``history``, ``list`` and ``erase``. Then, in process through click's runner
(no process each), what export refuses before writing anything, how it writes, what import takes
and never overwrites, and ``show --version`` in one query.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import event
from sqlalchemy.engine import Engine

from memstore.agent_doc import MAIN_DOC_PATH, AgentDocument, DocScope
from memstore.cli import agent_doc_transfer, main
from memstore.cli.exit_codes import EXIT_CONFLICT, EXIT_INVALID_ITEMS, EXIT_NOTHING_MATCHED, EXIT_USAGE
from memstore.config import MemoryConfig
from memstore.ops.agent_docs import (
    MAX_HISTORY_LIMIT,
    delete_doc,
    list_docs,
    read_doc,
    reset_agent_doc_stores,
    write_doc,
)
from tests.integration.conftest import Cli
from tests.support.terminal import run_on_terminal

CODER_MAIN = "# Coder\n\nRole: reviews Rust.\n- prefers small diffs\n"
PROJECT = "# Project x\nusé par l'équipe 数据\n"
WRITER_MAIN = "# Writer\nno trailing newline"
ADDED = "- added by the operator ✓\n"
EDITOR = """\
import os, sys
from pathlib import Path

path = Path(sys.argv[1])
if os.environ.get("RACE"):  # another writer stores a version while the operator edits
    from memstore.agent_doc import DocScope
    from memstore.ops.agent_docs import write_doc

    write_doc(DocScope("coder"), "/memories/agent.md", "the agent's own words",
              expected_version=None, author="agent", actor="alice")
mode = os.environ.get("EDIT", "append")
if mode == "append":
    path.write_bytes(path.read_bytes() + "- added by the operator ✓\\n".encode())
elif mode == "fail":
    sys.exit(3)
"""


def _deepagents(root: Path) -> Path:
    """``~/.deepagents``-style: one folder per agent, its agent.md at the top."""
    files = {
        "coder/agent.md": CODER_MAIN,
        "coder/projects/x.md": PROJECT,
        "Writer/agent.md": WRITER_MAIN,
    }
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return root


def _editor(cli: Cli, tmp_path: Path, **env: str) -> Cli:
    script = tmp_path / "editor.py"
    script.write_text(EDITOR, encoding="utf-8")
    environment = {k: v for k, v in cli.env.items() if k != "VISUAL"}
    return Cli(environment | {"EDITOR": f"{sys.executable} {script}", **env}, cli.url)


def _shown(cli: Cli, *args: str) -> dict[str, object]:
    shown = cli.json("agent-doc", "show", *args)
    assert isinstance(shown, dict)
    return shown


def test_import_a_deepagents_folder_reporting_what_it_cannot_take(cli: Cli, tmp_path: Path) -> None:
    root = _deepagents(tmp_path / "deepagents")
    (root / "coder" / "notes.txt").write_text("\ufeffany file with a valid name", encoding="utf-8")
    (root / "coder" / ".draft.md").write_text("hidden", encoding="utf-8")
    (root / "coder" / "latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    (root / "coder" / "huge.md").write_bytes(b"x" * 4001)  # over 4 bytes x agent_doc_max_chars 1000
    (root / "coder" / "bad name.md").write_text("spaces", encoding="utf-8")
    (root / "coder" / "passwd.md").symlink_to(tmp_path / "outside.md")
    (tmp_path / "outside.md").write_text("secret", encoding="utf-8")
    (root / "coder" / "inside.md").symlink_to(root / "coder" / "agent.md")
    (root / "bad agent").mkdir()
    (root / "bad agent" / "agent.md").write_text("x", encoding="utf-8")
    (root / "README.md").write_text("not an agent", encoding="utf-8")
    capped = Cli(cli.env | {"MEMSTORE_AGENT_DOC_MAX_CHARS": "1000"}, cli.url)

    result = capped("agent-doc", "import", str(root))
    assert result.returncode == EXIT_INVALID_ITEMS, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "imported: 5  unchanged: 0  invalid: 5  skipped: 1"
    reasons = {line.split(": ", 1)[0].strip(): line.split(": ", 1)[1] for line in lines[1:]}
    coder = root / "coder"
    assert reasons.pop(f"invalid {root / 'bad agent'}").startswith("Invalid agent_name 'bad agent'")
    assert reasons.pop(f"invalid {coder / 'bad name.md'}").startswith("each name in a path is 1-128")
    assert reasons == {
        f"invalid {coder / 'huge.md'}": "4001 bytes: more than a document may hold (agent_doc_max_chars)",
        f"invalid {coder / 'latin1.md'}": "not UTF-8 text (byte 3 is not valid)",
        f"invalid {coder / 'passwd.md'}": "a symbolic link out of the folder (not followed)",
        f"skipped {root / 'README.md'}": "not an agent's folder (FOLDER/<agent>/agent.md)",
    }

    listed = cli.json("agent-doc", "list", "--agent", "coder")["documents"]
    assert [(doc["path"], doc["version"], doc["author"]) for doc in listed] == [
        ("/memories/agent.md", 1, "import"),
        ("/memories/inside.md", 1, "import"),  # a link within the folder is read
        ("/memories/notes.txt", 1, "import"),
        ("/memories/projects/x.md", 1, "import"),
    ]
    assert _shown(cli, "coder", "/memories/notes.txt")["content"] == "any file with a valid name"  # no BOM
    shown = cli("agent-doc", "show", "coder")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == CODER_MAIN  # exactly as stored: `> FILE` keeps it
    assert shown.stderr.startswith("/memories/agent.md of coder: version 1 by import, updated ")
    writer = cli("agent-doc", "show", "writer")  # the folder Writer: agent names ignore case
    assert writer.stdout == WRITER_MAIN
    agents = cli.json("agent-doc", "list")["agents"]
    assert [(a["tenantId"], a["agentName"], a["userId"], a["documents"]) for a in agents] == [
        ("default", "coder", None, 4),
        ("default", "writer", None, 1),
    ]

    one = _deepagents(tmp_path / "one")
    result = cli(
        "agent-doc", "import", str(one / "coder"), "--agent", "coder", "--user", "alice", "--tenant", "acme"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "imported: 2  unchanged: 0  invalid: 0  skipped: 0"
    mine = _shown(cli, "coder", "/memories/projects/x.md", "--user", "alice", "--tenant", "acme")
    assert (mine["userId"], mine["tenantId"], mine["content"]) == ("alice", "acme", PROJECT)
    table = cli("agent-doc", "list", "--tenant", "acme")
    assert [line.split() for line in table.stdout.splitlines()][1][:4] == ["acme", "coder", "alice", "2"]


def test_export_round_trips_with_import_and_never_overwrites_unasked(cli: Cli, tmp_path: Path) -> None:
    source = _deepagents(tmp_path / "source")
    assert cli("agent-doc", "import", str(source)).returncode == 0
    out = tmp_path / "out"
    exported = cli.json("agent-doc", "export", str(out))
    assert sorted(exported["files"]) == sorted(
        str(out / name) for name in ("coder/agent.md", "coder/projects/x.md", "writer/agent.md")
    )
    for name, text in (("coder/agent.md", CODER_MAIN), ("coder/projects/x.md", PROJECT)):
        assert (out / name).read_bytes() == text.encode("utf-8")
    assert (out / "writer" / "agent.md").read_bytes() == WRITER_MAIN.encode("utf-8")

    again = cli("agent-doc", "import", str(out))
    assert again.returncode == 0 and again.stdout.splitlines()[0].startswith("imported: 0  unchanged: 3")

    (out / "coder" / "agent.md").write_text("changed on disk", encoding="utf-8")
    refused = cli("agent-doc", "export", str(out))
    assert refused.returncode == 1 and "3 file(s) to export are already there" in refused.stderr
    assert (out / "coder" / "agent.md").read_text(encoding="utf-8") == "changed on disk"  # nothing written
    forced = cli("agent-doc", "export", str(out), "--force")
    assert (
        forced.returncode == 0 and forced.stdout.strip() == f"exported 3 document(s) of 2 agent(s) to {out}"
    )
    assert (out / "coder" / "agent.md").read_bytes() == CODER_MAIN.encode("utf-8")

    single = tmp_path / "single"
    assert cli("agent-doc", "export", str(single), "--agent", "coder").returncode == 0
    assert sorted(str(p.relative_to(single)) for p in single.rglob("*.md")) == ["agent.md", "projects/x.md"]
    empty = cli.json("agent-doc", "export", str(tmp_path / "none"), "--user", "alice")
    assert empty["files"] == []


def test_edit_opens_the_editor_and_writes_over_the_version_it_opened(cli: Cli, tmp_path: Path) -> None:
    source = _deepagents(tmp_path / "source")
    assert cli("agent-doc", "import", str(source)).returncode == 0

    edited = _editor(cli, tmp_path)("agent-doc", "edit", "coder")
    assert edited.returncode == 0, edited.stderr
    assert (
        edited.stdout.strip()
        == f"wrote /memories/agent.md of coder: version 2, {len(CODER_MAIN + ADDED)} characters"
    )
    shown = _shown(cli, "coder")
    assert shown["content"] == CODER_MAIN + ADDED
    assert (shown["version"], shown["author"], shown["actor"]) == (2, "operator", None)

    for mode in ("keep", "fail"):  # saved unchanged; the editor failed: nothing is written
        result = _editor(cli, tmp_path, EDIT=mode)("agent-doc", "edit", "writer")
        if mode == "keep":
            assert (
                result.returncode == 0
                and result.stdout.strip() == "no change to /memories/agent.md of writer"
            )
        else:
            assert result.returncode == 1 and "Editing failed" in result.stderr
    assert _shown(cli, "writer")["version"] == 1

    created = _editor(cli, tmp_path)("agent-doc", "edit", "coder", "/memories/new.md", "--user", "bob")
    assert created.returncode == 0, created.stderr
    assert _shown(cli, "coder", "/memories/new.md", "--user", "bob")["content"] == ADDED

    raced = _editor(cli, tmp_path, RACE="1")("agent-doc", "edit", "coder")
    assert raced.returncode == EXIT_CONFLICT, raced.stderr
    assert "changed since you opened it (now version 3), so nothing was written" in raced.stderr
    kept = re.search(r"your text is saved in (\S+\.md)", raced.stderr)
    assert kept is not None
    saved = Path(kept.group(1))
    try:
        assert saved.read_text(encoding="utf-8") == f"{shown['content']}{ADDED}"
        assert oct(saved.stat().st_mode & 0o777) == "0o600"
    finally:
        saved.unlink()
    now = _shown(cli, "coder")
    assert (now["version"], now["author"], now["actor"], now["content"]) == (
        3,
        "agent",
        "alice",
        "the agent's own words",
    )


def test_show_a_version_history_and_mistakes(cli: Cli, tmp_path: Path) -> None:
    assert cli("agent-doc", "import", str(_deepagents(tmp_path / "source"))).returncode == 0
    assert _editor(cli, tmp_path)("agent-doc", "edit", "coder").returncode == 0

    first = cli("agent-doc", "show", "coder", "/memories/agent.md", "--version", "1")
    assert first.returncode == 0 and first.stdout == CODER_MAIN
    assert first.stderr.startswith("/memories/agent.md of coder: version 1, write by import ")
    assert _shown(cli, "coder", "--version", "2")["author"] == "operator"

    history = cli.json("agent-doc", "history", "coder", "/memories/agent.md")
    assert [(v["version"], v["action"], v["author"]) for v in history["versions"]] == [
        (2, "write", "operator"),
        (1, "write", "import"),
    ]
    every = cli("agent-doc", "history", "coder", "--limit", "2")
    lines = every.stdout.splitlines()
    assert lines[0].split() == ["CREATED", "PATH", "VERSION", "ACTION", "AUTHOR", "ACTOR", "CHARS"]
    assert lines[1].split()[1:6] == ["/memories/agent.md", "2", "write", "operator", "(none)"]
    assert lines[-1] == "showing 1-2 of the versions of /memories/ of coder"

    for args, code, said in (
        (("show", "coder", "/memories/none.md"), EXIT_NOTHING_MATCHED, "no document at /memories/none.md"),
        (("show", "nobody"), EXIT_NOTHING_MATCHED, "no document at /memories/agent.md"),
        (("show", "coder", "--version", "9"), EXIT_NOTHING_MATCHED, "no version 9 of /memories/agent.md"),
        (("show", "coder", "/memories/../etc/passwd"), EXIT_USAGE, "may not contain . or .. names"),
        (("show", "bad name"), EXIT_USAGE, "Invalid agent_name"),
        (("history", "coder", "--limit", "0"), EXIT_USAGE, "--limit"),
    ):
        result = cli("agent-doc", *args)
        assert result.returncode == code and said in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_erase_an_agent_asks_first_and_takes_its_users_documents_too(cli: Cli, tmp_path: Path) -> None:
    source = _deepagents(tmp_path / "source")
    assert cli("agent-doc", "import", str(source)).returncode == 0
    assert (
        cli("agent-doc", "import", str(source / "coder"), "--agent", "coder", "--user", "bob").returncode == 0
    )
    assert cli("agent-doc", "import", str(source), "--tenant", "acme").returncode == 0

    refused = cli("agent-doc", "erase", "coder")
    assert refused.returncode == EXIT_USAGE and "without --yes" in refused.stderr
    erased = cli.json("agent-doc", "erase", "coder", "--yes")
    assert erased["deleted"] == {"memory_agent_document_versions": 4, "memory_agent_documents": 4}
    agents = cli.json("agent-doc", "list")["agents"]
    assert [(a["tenantId"], a["agentName"]) for a in agents] == [
        ("acme", "coder"),  # another tenant's agent of the same name stays
        ("acme", "writer"),
        ("default", "writer"),
    ]
    again = cli("agent-doc", "erase", "coder", "--yes")
    assert again.returncode == EXIT_NOTHING_MATCHED and "agent coder has no documents" in again.stderr


def test_the_unnamed_agent_is_an_empty_name(cli: Cli, tmp_path: Path) -> None:
    edited = _editor(cli, tmp_path)("agent-doc", "edit", "")
    assert edited.returncode == 0 and edited.stdout.startswith("wrote /memories/agent.md of (no agent)")
    table = cli("agent-doc", "list").stdout.splitlines()
    assert table[1].split()[:3] == ["default", "(none)", "(none)"]
    skipped = cli("agent-doc", "export", str(tmp_path / "all"))
    assert "not exported: the unnamed agent" in skipped.stderr and skipped.returncode == 0
    alone = cli.json("agent-doc", "export", str(tmp_path / "unnamed"), "--agent", "")
    assert alone["files"] == [str(tmp_path / "unnamed" / "agent.md")]
    assert _shown(cli, "")["agentName"] is None


def test_show_is_exact_in_a_pipe_and_inert_on_a_terminal(cli: Cli, tmp_path: Path) -> None:
    hostile = "# Notes\nlikes \x1b[2J\x1b[31mred\x1b[0m\n\u202etea \x9b32m\tend\n"
    folder = tmp_path / "coder"
    folder.mkdir()
    (folder / "agent.md").write_bytes(hostile.encode("utf-8"))
    assert cli("agent-doc", "import", str(folder), "--agent", "coder").returncode == 0

    piped = cli("agent-doc", "show", "coder")
    assert piped.returncode == 0 and piped.stdout == hostile
    code, _, terminal = run_on_terminal(cli.env, "agent-doc", "show", "coder", stdout_too=True)
    assert code == 0 and "likes [2J[31mred[0m\ntea 32m\tend" in terminal
    assert all(mark not in terminal for mark in ("\x1b[2J", "\x9b", "\u202e"))


# In process, through click's runner: the same commands without a process each.

Invoke = Callable[..., Result]
CODER = DocScope("coder")


@pytest.fixture
def invoke(sql_url: str, isolated_config: MemoryConfig) -> Iterator[Invoke]:
    isolated_config.database_url = sql_url
    reset_agent_doc_stores()

    def run(*args: str) -> Result:
        return CliRunner().invoke(main, ["agent-doc", *args], catch_exceptions=False)

    yield run
    reset_agent_doc_stores()


def _store(scope: DocScope, documents: dict[str, str]) -> None:
    for path, text in documents.items():
        write_doc(scope, path, text, expected_version=None, author="agent")


def _tree(folder: Path) -> dict[str, bytes]:
    """Every entry under ``folder``: files with their bytes, anything else as ``b"<link>"``/``b"<dir>"``."""
    return {
        str(path.relative_to(folder)): b"<link>"
        if path.is_symlink()
        else (b"<dir>" if path.is_dir() else path.read_bytes())
        for path in sorted(folder.rglob("*"))
    }


@pytest.mark.parametrize(
    ("documents", "said"),
    [
        ({"/memories/a": "file", "/memories/a/b.md": "inside"}, "would be a file and the folder of"),
        ({"/memories/A": "file", "/memories/a/b.md": "inside"}, "would be a file and the folder of"),
        ({"/memories/Notes.md": "one", "/memories/notes.md": "two"}, "differ only in case"),
    ],
)
def test_export_refuses_documents_one_folder_cannot_hold_before_writing_any(
    invoke: Invoke, tmp_path: Path, documents: dict[str, str], said: str
) -> None:
    _store(CODER, {"/memories/agent.md": "main", **documents})
    out = tmp_path / "out"
    for extra in ((), ("--force",), ("--agent", "coder")):
        result = invoke("export", str(out), *extra)
        assert result.exit_code == 1 and said in result.stderr and "nothing was written" in result.stderr
        assert not out.exists(), extra


def test_export_never_writes_through_a_linked_folder(invoke: Invoke, tmp_path: Path) -> None:
    _store(CODER, {"/memories/agent.md": "main", "/memories/projects/x.md": PROJECT})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for link in ("coder", "coder/projects"):
        out = tmp_path / link.replace("/", "-")
        (out / link).parent.mkdir(parents=True, exist_ok=True)
        (out / link).symlink_to(elsewhere)
        for force in ((), ("--force",)):
            result = invoke("export", str(out), *force)
            assert result.exit_code == 1, result.output
            assert (
                f"{out / link} is a symbolic link" in result.stderr and "nothing was written" in result.stderr
            )
        assert list(elsewhere.iterdir()) == []
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "projects").symlink_to(elsewhere)  # --agent: a link below FOLDER, FOLDER itself may be one
    assert invoke("export", str(agent), "--agent", "coder", "--force").exit_code == 1
    assert list(elsewhere.iterdir()) == [] and not (agent / "agent.md").exists()


def test_export_replaces_each_file_whole_and_private(invoke: Invoke, tmp_path: Path) -> None:
    _store(CODER, {"/memories/agent.md": CODER_MAIN, "/memories/projects/x.md": PROJECT})
    out = tmp_path / "out"
    (out / "coder").mkdir(parents=True)
    victim, shared = tmp_path / "victim.md", tmp_path / "shared.md"
    victim.write_text("not the agent's", encoding="utf-8")
    shared.write_text("another name of the same file", encoding="utf-8")
    (out / "coder" / "agent.md").symlink_to(victim)
    (out / "coder" / "projects").mkdir()
    os.link(shared, out / "coder" / "projects" / "x.md")  # a write in place would change shared.md

    assert invoke("export", str(out)).exit_code == 1
    result = invoke("export", str(out), "--force")
    assert result.exit_code == 0, result.output
    assert victim.read_text(encoding="utf-8") == "not the agent's"
    assert shared.read_text(encoding="utf-8") == "another name of the same file"
    assert _tree(out) == {  # no link, no temporary file left
        "coder": b"<dir>",
        "coder/agent.md": CODER_MAIN.encode(),
        "coder/projects": b"<dir>",
        "coder/projects/x.md": PROJECT.encode(),
    }
    assert {
        oct((out / name).stat().st_mode & 0o777) for name in ("coder/agent.md", "coder/projects/x.md")
    } == {"0o600"}


def test_export_reads_each_text_as_it_writes_its_file(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One document's text in memory at a time; one deleted before its turn is left out."""
    _store(CODER, {"/memories/a.md": "a", "/memories/b.md": "b", "/memories/c.md": "c"})
    out = tmp_path / "out"
    on_disk: list[list[str]] = []

    def read_as_written(scope: DocScope, path: str) -> AgentDocument:
        on_disk.append(sorted(p.name for p in out.rglob("*.md")))
        if path == "/memories/c.md":  # an agent deletes it while the export runs
            delete_doc(scope, path, expected_version=None, author="agent")
        return read_doc(scope, path)

    monkeypatch.setattr(agent_doc_transfer, "read_doc", read_as_written)
    result = invoke("export", str(out), "--agent", "coder")
    assert result.exit_code == 0, result.output
    assert on_disk == [[], ["a.md"], ["a.md", "b.md"]]
    assert result.stderr == "not exported: /memories/c.md of coder was deleted meanwhile\n"
    assert result.stdout == f"exported 2 document(s) of 1 agent(s) to {out}\n"


def test_an_exported_folder_imports_back_unchanged_whatever_the_names(invoke: Invoke, tmp_path: Path) -> None:
    documents = {
        "/memories/agent.md": CODER_MAIN,
        "/memories/notes.txt": "plain text",
        "/memories/data/table.csv": "a,b\n1,2\n",
        "/memories/README": "no extension",
    }
    _store(CODER, documents)
    _store(DocScope("writer"), {"/memories/agent.md": WRITER_MAIN})
    out = tmp_path / "out"
    assert invoke("export", str(out)).exit_code == 0
    again = invoke("import", str(out))
    assert (
        again.exit_code == 0
        and again.stdout.splitlines()[0] == "imported: 0  unchanged: 5  invalid: 0  skipped: 0"
    )
    copied = invoke("import", str(out), "--tenant", "acme")
    assert copied.exit_code == 0, copied.output
    acme = DocScope("coder", tenant_id="acme")
    assert {doc.path: read_doc(acme, doc.path).content for doc in list_docs(acme)} == documents

    (out / "coder" / "crlf.md").write_bytes(b"\xef\xbb\xbfwritten\r\non Windows\r\n")
    for counts in ("imported: 1  unchanged: 5", "imported: 0  unchanged: 6"):  # compared as stored
        assert invoke("import", str(out)).stdout.startswith(counts)
    assert read_doc(CODER, "/memories/crlf.md").content == "written\non Windows\n"


def test_import_takes_one_folder_per_agent_name(invoke: Invoke, tmp_path: Path) -> None:
    root = tmp_path / "agents"
    for folder, text in (("Coder", "from Coder"), ("coder", "from coder")):
        (root / folder).mkdir(parents=True)
        (root / folder / "agent.md").write_text(text, encoding="utf-8")
    result = invoke("import", str(root))
    assert result.exit_code == EXIT_INVALID_ITEMS, result.output
    assert result.stdout.splitlines() == [
        "imported: 1  unchanged: 0  invalid: 1  skipped: 0",
        f"  invalid {root / 'coder'}: the folder Coder is agent coder too (agent names ignore case): "
        "nothing in this one was imported",
    ]
    stored = read_doc(CODER, "/memories/agent.md")
    assert (stored.content, stored.version) == ("from Coder", 1)


def test_import_never_overwrites_a_write_made_after_it_compared(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent writes each document right after the import has read it (or found it missing)."""
    _store(CODER, {"/memories/agent.md": "before"})
    folder = tmp_path / "coder"
    folder.mkdir()
    (folder / "agent.md").write_text("the operator's", encoding="utf-8")
    (folder / "new.md").write_text("the operator's", encoding="utf-8")

    def read_then_agent_writes(scope: DocScope, path: str) -> AgentDocument:
        try:
            return read_doc(scope, path)
        finally:
            write_doc(scope, path, "the agent's", expected_version=None, author="agent")

    monkeypatch.setattr(agent_doc_transfer, "read_doc", read_then_agent_writes)
    result = invoke("import", str(folder), "--agent", "coder")
    assert result.exit_code == EXIT_INVALID_ITEMS, result.output
    assert result.stdout.splitlines() == [
        "imported: 0  unchanged: 0  invalid: 2  skipped: 0",
        f"  invalid {folder / 'agent.md'}: /memories/agent.md of coder changed during the import "
        "(now version 2): not overwritten",
        f"  invalid {folder / 'new.md'}: /memories/new.md of coder changed during the import "
        "(now version 1): not overwritten",
    ]
    assert [(doc.path, doc.author) for doc in list_docs(CODER)] == [
        ("/memories/agent.md", "agent"),
        ("/memories/new.md", "agent"),
    ]


def test_show_finds_an_old_version_in_one_query(invoke: Invoke, isolated_config: MemoryConfig) -> None:
    isolated_config.agent_doc_history_keep = 1000
    for number in range(1, MAX_HISTORY_LIMIT + 2):
        write_doc(CODER, MAIN_DOC_PATH, f"version {number}", expected_version=None, author="agent")
    queries: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "memory_agent_document_versions" in statement and statement.lstrip().upper().startswith("SELECT"):
            queries.append(statement)

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        result = invoke("show", "coder", "--version", "1")
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert result.exit_code == 0 and result.stdout == "version 1"
    assert len(queries) == 1
