"""A deterministic, offline extractor for installs without an LLM endpoint.

It reads only the user's own turns and turns explicit first-person statements into the same
normalised ``MemoryUpdate`` the LLM path parses out of a reply, so the same apply code runs.
It is plainly **lower-recall than an LLM**: it never infers, never rewrites history
summaries and never removes facts.

What it catches (case-insensitive English, simplified Chinese), one clause at a time:

==================  ==========================================================  ==========  ====
Rule                Example statements                                          Category    Conf
==================  ==========================================================  ==========  ====
name                "My name is Ana", "Call me Ana", "我叫小王", "我的名字是小王"  context     0.95
work                "I work at/for Acme", "I work as a DBA", "I work on X",     context     0.90
                    "我在杭州的一家公司工作"
residence           "I live in Lisbon", "我住在杭州"                              context     0.90
identity            "I'm a data engineer", "I am an avid runner", "我是一名设计师"  context     0.85
preference          "I prefer X", "I'd rather X", "我更喜欢X"                      preference  0.90
likes / dislikes    "I like/love/enjoy X", "I hate/dislike/don't like X",       preference  0.85
                    "我喜欢X", "我不喜欢X", "我讨厌X"
goal                "My goal is to X", "我的目标是X"                               goal        0.90
intent              "I want/plan/hope/need to X", "I'm trying/planning to X",   goal        0.80
                    "我想X", "我希望X", "我打算X", "我正在尝试X"
correction          only with a correction signal ("that's wrong", "不对",        correction  0.95
                    "改用", or the caller's flag): "use X instead (of Y)",
                    "don't use Y, use X", "改用X", "用X而不是Y", "不要用Y，改用X";
                    ``sourceError`` is set when Y is stated
==================  ==========================================================  ==========  ====

Every confidence is at least 0.8, above the default 0.7 threshold, because each rule
only fires on an explicit statement. Work and job-like identity statements fill
``workContext``, goals fill ``topOfMind``, everything else except corrections fills
``personalContext``; new sentences are appended to the stored summary.

Record fields (``memstore.record``), what can be known without judgement: ``sourceKind`` is
``explicit_user_input`` (every rule reads the user's own statement; corrections become
``corrected_memory`` in the parser), ``type`` is the category's default type, ``raw`` is the
text the rule matched and nothing more (the clause, or the correction's phrase, never the rest of
the sentence or message: "I work at Acme, my password is hunter2" keeps "I work at Acme"; a clause
whose "I" was implied keeps the user's words without it, and a leading "hi", "so" or "actually"
is left out; whitespace collapsed, cut at
``MAX_RAW_CHARS``, left out when it holds text the store cannot keep), and the name, work and
residence rules tag their
fact ``name``, ``work`` or ``location`` (a job-like identity statement ``work`` too). Importance
is a judgement, so it stays at the default.

What it misses: anything implied rather than stated, third-person or past-tense statements
("we moved to Postgres"), negations other than the listed dislikes, statements inside
questions (sentences ending in "?", "吗", "呢" are skipped), other languages, contradictions
(it never fills ``factsToRemove``), history summaries, and anything the assistant said.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memstore.capture.filtering import memory_turns
from memstore.document import HISTORY_SECTIONS, USER_SECTIONS, MemoryDocument, fact_content_key, unstorable
from memstore.record import MAX_RAW_CHARS, default_type
from memstore.update.parser import MemoryUpdate, normalise_update

WORK_SECTION, PERSONAL_SECTION, FOCUS_SECTION = USER_SECTIONS
MAX_CAPTURE_CHARS = 200
MAX_CORRECTION_SENTENCE_CHARS = 3 * MAX_CAPTURE_CHARS

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；;])\s*|\n+")
_CLAUSE_SPLIT = re.compile(
    r"\s*(?:[,，;；]\s*(?:(?:and|but|so)\s+)?|\s+(?:and|but|so)\s+)(?=(?:i\b|i'[md]\b|my\b|我))",
    re.IGNORECASE,
)
# "I work at Acme and prefer Python": the second clause's subject is implied. It is split off and
# given its "I" back, so it reads "User prefers Python", not "User works at Acme and prefer Python".
_IMPLIED_SUBJECT_SPLIT = re.compile(
    r"\s*,?\s+and\s+(?=(?:prefer|like|love|enjoy|hate|dislike|want|need|plan|hope|work|live)\b)",
    re.IGNORECASE,
)
_EN_LEAD = (
    r"^(?:(?:hi|hello|hey|so|and|but|also|well|actually|honestly|btw|oh|ok|okay|yes|no|fyi)\b[,!.]?\s*)*"
)
_FIRST_PERSON_START = re.compile(_EN_LEAD + r"i\b", re.IGNORECASE)
_LEAD = re.compile(_EN_LEAD, re.IGNORECASE)
_QUESTION_END = re.compile(r"(?:[?？]|[吗呢][。！？?!.]?)\s*$")
_TRAILING_PUNCT = " \t.,;:!?。，；：！？…~吧啊呀哦嘛"
_PRONOUNS = {"my": "their", "our": "their", "me": "them", "myself": "themselves", "mine": "theirs"}
_PRONOUN_RE = re.compile(r"\b(?:my|our|me|myself|mine)\b")
_WORK_WORDS = re.compile(
    r"engineer|developer|programmer|scientist|analyst|manager|designer|architect|consultant|"
    r"researcher|founder|admin|dba|devops|sre|student|teacher|professor|doctor|nurse|lawyer|"
    r"accountant|intern|lead|director|工程师|开发|程序员|经理|设计师|分析师|研究员|学生|老师|教师|"
    r"医生|律师|会计|架构师|产品",
    re.IGNORECASE,
)
_IDENTITY_STOP = re.compile(r"^(?:an? )?(?:bit|little|lot|few|couple|big fan)\b", re.IGNORECASE)
_ZH_IDENTITY_STOP = ("说", "不", "否", "想", "在", "真的", "来", "要")
_ZH_WANT_STOP = ("知道", "问", "请问", "了解一下", "看看")

_EN_CORRECTION_SIGNAL = re.compile(
    r"\b(?:that|this|it)(?:'s| is) (?:wrong|incorrect|not right|not correct)\b|"
    r"\byou(?:'re| are) wrong\b|\byou misunderstood\b|\bnot what i (?:asked|wanted)\b",
    re.IGNORECASE,
)
_ZH_CORRECTION_SIGNAL = re.compile(r"不对|错了|你理解错了|你理解有误|不是这样|改用")
_EN_PART = r"[^,.;!?]+"
_ZH_PART = r"[^，,。；;！!？?]+"
_CORRECTION_PATTERNS = (
    re.compile(
        rf"\bdon'?t use (?P<y>{_EN_PART}?)[,;]?\s+(?:and )?use (?P<x>{_EN_PART}?)(?: instead)?(?=[,.;!?]|$)",
        re.I,
    ),
    re.compile(
        rf"\b(?:use|try|switch to|go with) (?P<x>{_EN_PART}?) (?:instead of|rather than) (?P<y>{_EN_PART})",
        re.I,
    ),
    re.compile(rf"\b(?:use|try|switch to|go with) (?P<x>{_EN_PART}?) instead\b", re.I),
    re.compile(rf"不要(?:再)?用(?P<y>{_ZH_PART}?)[，,]\s*(?:改用|用|换成)(?P<x>{_ZH_PART})"),
    re.compile(rf"用(?P<x>{_ZH_PART}?)而不是(?:用)?(?P<y>{_ZH_PART})"),
    re.compile(rf"(?:改用|换成)(?P<x>{_ZH_PART})"),
)


@dataclass(frozen=True)
class Finding:
    content: str
    category: str
    confidence: float
    section: str | None
    source_error: str | None = None
    tag: str | None = None
    raw: str | None = None


Builder = Callable[[re.Match[str]], Finding | None]


def _third_person(text: str) -> str:
    return _PRONOUN_RE.sub(lambda match: _PRONOUNS[match.group(0)], text)


def _capture(match: re.Match[str], group: str = "x") -> str | None:
    value = match.group(group).strip().strip(_TRAILING_PUNCT).strip()
    if not value or len(value) > MAX_CAPTURE_CHARS:
        return None
    return _third_person(value)


def _template(
    template: str, category: str, confidence: float, section: str | None, tag: str | None = None
) -> Builder:
    def build(match: re.Match[str]) -> Finding | None:
        value = _capture(match)
        if value is None:
            return None
        verb = (match.groupdict().get("verb") or "").lower()
        return Finding(template.format(x=value, verb=verb), category, confidence, section, tag=tag)

    return build


def _identity(match: re.Match[str]) -> Finding | None:
    value = _capture(match)
    if value is None or _IDENTITY_STOP.match(value) or value.startswith(_ZH_IDENTITY_STOP):
        return None
    work = _WORK_WORDS.search(value) is not None
    prefix = "用户是" if re.match(r"[\u4e00-\u9fff]", match.group(0)) else "User is "
    section, tag = (WORK_SECTION, "work") if work else (PERSONAL_SECTION, None)
    return Finding(prefix + value, "context", 0.85, section, tag=tag)


def _zh_want(match: re.Match[str]) -> Finding | None:
    value = _capture(match)
    if value is None or value.startswith(_ZH_WANT_STOP):
        return None
    return Finding(f"用户{match.group('verb')}{value}", "goal", 0.8, FOCUS_SECTION)


_VERB_3RD = {"want": "wants", "plan": "plans", "hope": "hopes", "intend": "intends", "need": "needs"}
_LIKE_3RD = {"like": "likes", "love": "loves", "enjoy": "enjoys"}


def _en_intent(match: re.Match[str]) -> Finding | None:
    value = _capture(match)
    if value is None:
        return None
    return Finding(f"User {_VERB_3RD[match.group('verb').lower()]} to {value}", "goal", 0.8, FOCUS_SECTION)


def _en_like(match: re.Match[str]) -> Finding | None:
    value = _capture(match)
    if value is None:
        return None
    return Finding(
        f"User {_LIKE_3RD[match.group('verb').lower()]} {value}", "preference", 0.85, PERSONAL_SECTION
    )


def _en_rule(pattern: str) -> re.Pattern[str]:
    return re.compile(_EN_LEAD + pattern, re.IGNORECASE)


_RULES: tuple[tuple[re.Pattern[str], Builder], ...] = (
    (
        _en_rule(r"my name is (?P<x>.+)"),
        _template("User's name is {x}", "context", 0.95, PERSONAL_SECTION, "name"),
    ),
    (
        _en_rule(r"(?:please )?call me (?P<x>.+)"),
        _template("User wants to be called {x}", "preference", 0.95, PERSONAL_SECTION, "name"),
    ),
    (
        _en_rule(r"i (?:currently )?work (?:at|for) (?P<x>.+)"),
        _template("User works at {x}", "context", 0.9, WORK_SECTION, "work"),
    ),
    (
        _en_rule(r"i (?:currently )?work as (?P<x>.+)"),
        _template("User works as {x}", "context", 0.9, WORK_SECTION, "work"),
    ),
    (
        _en_rule(r"i (?:currently )?work on (?P<x>.+)"),
        _template("User works on {x}", "context", 0.9, WORK_SECTION, "work"),
    ),
    (
        _en_rule(r"i (?:currently )?live in (?P<x>.+)"),
        _template("User lives in {x}", "context", 0.9, PERSONAL_SECTION, "location"),
    ),
    (
        _en_rule(r"i(?:'m| am) (?P<verb>trying|planning|hoping) to (?P<x>.+)"),
        _template("User is {verb} to {x}", "goal", 0.8, FOCUS_SECTION),
    ),
    (_en_rule(r"i(?:'m| am) (?P<x>an? .+)"), _identity),
    (
        _en_rule(r"i (?:really |strongly |generally |usually )?prefer (?P<x>.+)"),
        _template("User prefers {x}", "preference", 0.9, PERSONAL_SECTION),
    ),
    (
        _en_rule(r"i(?:'d| would) rather (?P<x>.+)"),
        _template("User would rather {x}", "preference", 0.9, PERSONAL_SECTION),
    ),
    (
        _en_rule(r"i (?:really )?(?:hate|dislike|don'?t like|do not like|can'?t stand) (?P<x>.+)"),
        _template("User dislikes {x}", "preference", 0.85, PERSONAL_SECTION),
    ),
    (_en_rule(r"i (?:really )?(?P<verb>like|love|enjoy) (?P<x>.+)"), _en_like),
    (
        _en_rule(r"my (?:main |current |primary )?goal is (?P<x>.+)"),
        _template("User's goal is {x}", "goal", 0.9, FOCUS_SECTION),
    ),
    (_en_rule(r"i (?:really )?(?P<verb>want|plan|hope|intend|need) to (?P<x>.+)"), _en_intent),
    (re.compile(r"^我叫(?P<x>.+)"), _template("用户叫{x}", "context", 0.95, PERSONAL_SECTION, "name")),
    (
        re.compile(r"^我的名字(?:是|叫)(?P<x>.+)"),
        _template("用户的名字是{x}", "context", 0.95, PERSONAL_SECTION, "name"),
    ),
    (
        re.compile(r"^我(?:正在|在)(?:尝试|努力|试着)(?P<x>.+)"),
        _template("用户正在尝试{x}", "goal", 0.8, FOCUS_SECTION),
    ),
    (
        re.compile(r"^我(?:目前|现在)?在(?P<x>.+?)(?:工作|上班|任职)"),
        _template("用户在{x}工作", "context", 0.9, WORK_SECTION, "work"),
    ),
    (
        re.compile(r"^我(?:目前|现在)?住在(?P<x>.+)"),
        _template("用户住在{x}", "context", 0.9, PERSONAL_SECTION, "location"),
    ),
    (
        re.compile(r"^我(?:很|非常|特别)?(?:不喜欢|讨厌)(?P<x>.+)"),
        _template("用户不喜欢{x}", "preference", 0.85, PERSONAL_SECTION),
    ),
    (
        re.compile(r"^我(?:更|比较)(?:喜欢|倾向于|偏好)(?P<x>.+)"),
        _template("用户更喜欢{x}", "preference", 0.9, PERSONAL_SECTION),
    ),
    (
        re.compile(r"^我(?:很|非常|特别|最)?(?:喜欢|偏好)(?P<x>.+)"),
        _template("用户喜欢{x}", "preference", 0.85, PERSONAL_SECTION),
    ),
    (
        re.compile(r"^我的(?:主要|当前)?目标是(?P<x>.+)"),
        _template("用户的目标是{x}", "goal", 0.9, FOCUS_SECTION),
    ),
    (re.compile(r"^我(?:目前|现在)?(?:是|当)(?:一名|一个|一位)?(?P<x>.+)"), _identity),
    (re.compile(r"^我(?P<verb>想要|想|希望|打算|计划)(?P<x>.+)"), _zh_want),
)


def _sentences(text: str) -> list[str]:
    """The sentences of ``text``, each with its whitespace runs collapsed to one space.

    Collapsing first keeps every pattern below linear: ``\\s*`` next to ``\\s+`` over a run of a
    thousand spaces made the clause split take seconds (issue 13 item 1, on the rules path).
    """
    return [" ".join(sentence.split()) for sentence in _SENTENCE_SPLIT.split(text)]


_IMPLIED_I = "I "


def _clauses(text: str) -> list[tuple[str, int]]:
    """Each clause of ``text``, with how many of its leading characters are not the user's (an
    implied subject's ``"I "``)."""
    clauses: list[tuple[str, int]] = []
    for sentence in _sentences(text):
        if sentence and not _QUESTION_END.search(sentence):
            for part in _CLAUSE_SPLIT.split(sentence):
                part = part.strip()
                if not part:
                    continue
                if not _FIRST_PERSON_START.match(part):  # "Bob and Alice work at Acme" is not about the user
                    clauses.append((part, 0))
                    continue
                first, *implied = _IMPLIED_SUBJECT_SPLIT.split(part)
                clauses.append((first, 0))
                clauses.extend((_IMPLIED_I + rest, len(_IMPLIED_I)) for rest in implied)
    return clauses


def _leading_words(text: str) -> int:
    """How many characters of ``text`` are the leading "hi", "so", "actually" the rules skip."""
    lead = _LEAD.match(text)
    return lead.end() if lead is not None else 0


def _raw(matched: str) -> str | None:
    """The text a rule matched, as its finding's ``raw``: capped, and only when the store can keep it."""
    raw = matched[:MAX_RAW_CHARS].strip().rstrip(",;，；").rstrip()
    return raw if raw and unstorable(raw) is None else None


def _statement_findings(text: str) -> list[Finding]:
    findings: list[Finding] = []
    for clause, implied in _clauses(text):
        for pattern, build in _RULES:
            match = pattern.match(clause)
            if match is None:
                continue
            finding = build(match)
            if finding is not None:
                said = clause[max(match.start(), implied) : match.end()]
                findings.append(replace(finding, raw=_raw(said[_leading_words(said) :])))
            break
    return findings


def _correction_findings(text: str) -> list[Finding]:
    # A correction names at most two captures of MAX_CAPTURE_CHARS, so a longer sentence cannot
    # hold one; skipping those keeps the lazy patterns' search linear in the message.
    sentences = [sentence for sentence in _sentences(text) if len(sentence) <= MAX_CORRECTION_SENTENCE_CHARS]
    for pattern in _CORRECTION_PATTERNS:
        match = next(filter(None, map(pattern.search, sentences)), None)
        if match is None:
            continue
        target = _capture(match)
        if target is None:
            continue
        mistake = _capture(match, "y") if "y" in pattern.groupindex else None
        chinese = bool(re.search(r"[\u4e00-\u9fff]", match.group(0)))
        if chinese:
            content = f"应使用{target}，而不是{mistake}" if mistake else f"应使用{target}"
            source_error = f"使用了{mistake}" if mistake else None
        else:
            content = f"Use {target} instead of {mistake}" if mistake else f"Use {target} instead"
            source_error = f"Used {mistake} instead of {target}" if mistake else None
        return [Finding(content, "correction", 0.95, None, source_error, raw=_raw(match.group(0)))]
    return []


def _summary_sentence(content: str) -> str:
    return content + ("。" if re.search(r"[\u4e00-\u9fff]$", content) else ".")


def _merged_summary(existing: object, sentences: list[str]) -> str:
    current = existing.strip() if isinstance(existing, str) else ""
    folded = current.casefold()
    fresh = [sentence for sentence in sentences if sentence.casefold() not in folded]
    return " ".join([current, *fresh]).strip() if fresh else ""


def _stored_summary(memory: MemoryDocument | None, section: str) -> object:
    user = memory.get("user") if isinstance(memory, dict) else None
    entry = user.get(section) if isinstance(user, dict) else None
    return entry.get("summary") if isinstance(entry, dict) else None


def extract_findings(messages: Sequence[Any], *, correction_detected: bool = False) -> list[Finding]:
    """Facts stated by the user, deduplicated by content key, in conversation order."""
    findings: list[Finding] = []
    seen: set[str] = set()
    for kind, text in memory_turns(messages):
        if kind != "human":
            continue
        found = _statement_findings(text)
        if correction_detected or _EN_CORRECTION_SIGNAL.search(text) or _ZH_CORRECTION_SIGNAL.search(text):
            found += _correction_findings(text)
        for finding in found:
            key = fact_content_key(finding.content)
            if key not in seen:
                seen.add(key)
                findings.append(finding)
    return findings


def extract_update(
    messages: Sequence[Any],
    current_memory: MemoryDocument | None = None,
    *,
    correction_detected: bool = False,
) -> MemoryUpdate:
    """The normalised update for ``messages``: stated facts, and user summaries extended with them."""
    findings = extract_findings(messages, correction_detected=correction_detected)
    user: dict[str, dict[str, Any]] = {}
    for section in USER_SECTIONS:
        sentences = [_summary_sentence(f.content) for f in findings if f.section == section]
        summary = _merged_summary(_stored_summary(current_memory, section), sentences)
        user[section] = {"summary": summary, "shouldUpdate": bool(summary)}
    new_facts: list[dict[str, Any]] = []
    for finding in findings:
        fact: dict[str, Any] = {
            "content": finding.content,
            "category": finding.category,
            "confidence": finding.confidence,
            "type": default_type(finding.category),
            "sourceKind": "explicit_user_input",
            "tags": [finding.tag] if finding.tag else [],
            "raw": finding.raw,
        }
        if finding.source_error:
            fact["sourceError"] = finding.source_error
        new_facts.append(fact)
    # The parser's normaliser applies the same caps an LLM reply gets (a summary grown past
    # MAX_SUMMARY_CHARS by appending is not stored), without a JSON round trip.
    return normalise_update(
        {
            "user": user,
            "history": {section: {"summary": "", "shouldUpdate": False} for section in HISTORY_SECTIONS},
            "newFacts": new_facts,
            "factsToRemove": [],
        }
    )
