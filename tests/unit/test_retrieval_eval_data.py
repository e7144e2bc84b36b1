"""The labelled retrieval set is what docs/performance.md says it is."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "retrieval_eval.json"
_CJK = re.compile(r"[\u4e00-\u9fff]")


def test_the_set_has_its_users_facts_queries_and_pairs() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    users = {user["user_id"]: user for user in data["users"]}
    assert len(users) == 20
    assert Counter(user["language"] for user in users.values()) == {"en": 10, "zh": 10}
    facts = {fact["id"]: (user["user_id"], fact) for user in users.values() for fact in user["facts"]}
    assert len(facts) == sum(len(user["facts"]) for user in users.values()) == 300
    for user_id, fact in facts.values():
        assert bool(_CJK.search(fact["content"])) == (users[user_id]["language"] == "zh")
        assert 0 < fact["confidence"] <= 1 and fact["category"]
        assert fact["importance"] in (0.3, 0.5, 0.7, 0.9)  # docs/performance.md: how they were labelled
    levels = Counter(fact["importance"] for _, fact in facts.values())
    assert levels == {0.3: 32, 0.5: 87, 0.7: 111, 0.9: 70}
    assert all(fact["importance"] == 0.9 for _, fact in facts.values() if fact["category"] == "correction")
    queries = data["queries"]
    assert len({query["id"] for query in queries}) == len(queries) == 80
    assert Counter(query["language"] for query in queries) == {"en": 40, "zh": 40}
    for query in queries:
        assert 1 <= len(query["relevant"]) <= 3
        assert all(facts[fact_id][0] == query["user_id"] for fact_id in query["relevant"])
        assert users[query["user_id"]]["language"] == query["language"]
    pairs = data["duplicates"]
    assert Counter((pair["language"], pair["duplicate"]) for pair in pairs) == {
        ("en", True): 15,
        ("en", False): 15,
        ("zh", True): 15,
        ("zh", False): 15,
    }
