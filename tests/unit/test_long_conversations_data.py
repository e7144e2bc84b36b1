"""The long-conversation set (scripts/eval_longconv.py) is as large and as well-formed as its docs say."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from memstore.document import fact_content_key

DATA = Path(__file__).resolve().parents[1] / "data" / "long_conversations.json"
KINDS = {"single-hop", "multi-hop", "temporal", "open-domain"}
_CJK = re.compile(r"[\u4e00-\u9fff]")


def _load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    return data


def _time(stamp: str) -> datetime:
    assert stamp.endswith("Z"), stamp
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_each_conversation_is_long_dated_in_order_and_in_its_language() -> None:
    conversations = _load()["conversations"]
    assert Counter(c["language"] for c in conversations) == {"en": 2, "zh": 2}
    assert len({c["id"] for c in conversations}) == len({c["user_id"] for c in conversations}) == 4
    for conversation in conversations:
        sessions = conversation["sessions"]
        turns = [turn for session in sessions for turn in session["turns"]]
        assert len(sessions) >= 8 and len(turns) >= 250
        assert len({s["id"] for s in sessions}) == len(sessions)
        assert len({t["id"] for t in turns}) == len(turns)
        # Spread over months, so "last May" and "before moving" have an answer.
        assert (_time(sessions[-1]["date"]) - _time(sessions[0]["date"])).days >= 300
        stamps = [_time(turn["time"]) for turn in turns]
        assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
        for session in sessions:
            assert _time(session["turns"][0]["time"]) == _time(session["date"])
        assert {t["role"] for t in turns} == {"user", "assistant"}
        assert sum(t["role"] == "assistant" for t in turns) >= len(turns) // 3
        chinese = conversation["language"] == "zh"
        assert all(bool(_CJK.search(t["content"])) == chinese for t in turns if len(t["content"]) > 30)
        # The SQL provider keeps one live fact per content key and scope, so a repeated turn would
        # collapse into one fact and its second id could never be retrieved.
        keys = Counter(fact_content_key(t["content"]) for t in turns)
        assert max(keys.values()) == 1
        assert all(0 < len(t["content"]) <= 2000 for t in turns)


def test_questions_cover_every_kind_in_both_languages_with_evidence_in_their_conversation() -> None:
    data = _load()
    conversations = {c["id"]: c for c in data["conversations"]}
    questions = data["questions"]
    assert len({q["id"] for q in questions}) == len(questions) >= 160
    languages = Counter(conversations[q["conversation"]]["language"] for q in questions)
    assert languages["en"] >= 35 and languages["zh"] >= 35
    assert {(conversations[q["conversation"]]["language"], q["kind"]) for q in questions} == {
        (language, kind) for language in ("en", "zh") for kind in KINDS
    }
    for cid, conversation in conversations.items():
        session_of = {t["id"]: s for s in conversation["sessions"] for t in s["turns"]}
        mine = [q for q in questions if q["conversation"] == cid]
        assert all(sum(q["kind"] == kind for q in mine) >= 8 for kind in KINDS)
        last = _time(conversation["sessions"][-1]["date"])
        for question in mine:
            evidence = question["evidence"]
            assert evidence and len(set(evidence)) == len(evidence)
            assert set(evidence) <= set(session_of), question["id"]
            assert question["question"].strip() and question["answer"].strip()
            assert _time(question["asked_at"]) > last  # asked after everything it may rely on
            sessions = {session_of[turn]["id"] for turn in evidence}
            if question["kind"] == "multi-hop":
                assert len(sessions) >= 2, question["id"]
            # Evidence is what the user said; the assistant's replies are distractors.
            roles = {t["id"]: t["role"] for s in conversation["sessions"] for t in s["turns"]}
            assert all(roles[turn] == "user" for turn in evidence)


def test_questions_do_not_copy_their_evidence() -> None:
    """Phrased as a user would ask, not lifted from the turn: no run of four of the evidence's words
    (six characters in Chinese)."""
    data = _load()
    turns = {
        (c["id"], t["id"]): t["content"]
        for c in data["conversations"]
        for s in c["sessions"]
        for t in s["turns"]
    }
    for question in data["questions"]:
        text = question["question"].casefold()
        for turn in question["evidence"]:
            content = turns[(question["conversation"], turn)].casefold()
            if _CJK.search(content):
                runs = {content[i : i + 6] for i in range(len(content) - 5)}
                assert not any(run in text for run in runs), question["id"]
            else:
                words = re.findall(r"\w+", content)
                runs = {" ".join(words[i : i + 4]) for i in range(len(words) - 3)}
                assert not any(run in " ".join(re.findall(r"\w+", text)) for run in runs), question["id"]
