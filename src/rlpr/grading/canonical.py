"""Values a reader reads alike however they are written (issue 59, item 4), compared in one form:

- numbers: "1,000", "1e3", "1 \\times 10^{3}", "1 × 10^3", "one thousand", "a thousand", "two hundred
  and six", "twenty-one", and after "approximately", "about", "around", "roughly", "~", "≈";
- ordinals: "21st", "twenty-first" (the number 21);
- percents: "25%", "25 \\%", "25 percent", "25 per cent" are 25 percent, equal to a reference of 0.25
  (TheoremQA's rule: its clean_units reads "%" as "/100") and, as a reader of a question asked in
  percent reads it, to a reference of 25;
- dates: "May 3, 2001", "May 3rd, 2001", "3 May 2001", "3rd of May 2001", "2001-05-03", "Sept. 3, 2001"
  (one calendar day; numeric day/month orders other than ISO are ambiguous and not read);
- booleans: "true"/"correct" and "false"/"incorrect" (the math grader also reads "yes"/"no").

`same_value` compares an answer with a reference in these forms; `gold_variants` writes a reference in
the other forms (and a one-word lowercase reference in its regular plural), so that a statement naming
it in another form ("the 3rd of May 2001", "two hundred six bones", "are called kittens") fills its
answer slot.
"""

from __future__ import annotations

import math
import re

MONTHS = ("january february march april may june july august september october november december").split()
_MONTH_ABBREVIATIONS = {m[:3]: i for i, m in enumerate(MONTHS, 1)} | {"sept": 9}
_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen " \
         "sixteen seventeen eighteen nineteen".split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINAL_WORDS = {"first": 1, "second": 2, "third": 3, "fifth": 5, "eighth": 8, "ninth": 9, "twelfth": 12}
_APPROX = re.compile(r"^(?:approximately|approx\.?|about|around|roughly|circa|ca\.|~|≈|\\approx|close\s+to)\s*",
                     re.IGNORECASE)
_NUMBER = re.compile(r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?")
_SCIENTIFIC = re.compile(
    r"([-+−]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?:[eE]\s*([-+−]?\d+)|(?:[x×*·]|\\times|\\cdot)\s*10\s*(?:\^|\*\*)\s*\{?\s*([-+−]?\d+)\s*\}?)")
_PERCENT = re.compile(r"^(.*?\S)\s*(?:\\?%|percent|per\s+cent)$", re.IGNORECASE)
_ORDINAL_SUFFIX = re.compile(r"^(\d+)(?:st|nd|rd|th)$", re.IGNORECASE)
_TRUE, _FALSE = frozenset({"true", "correct"}), frozenset({"false", "incorrect"})


def _plain(text: str) -> str:
    text = re.sub(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}", r"\1", text)
    return " ".join(text.replace("$", " ").split()).strip(" .*").replace("−", "-")


def number_value(text: str) -> float | None:
    """The number `text` is, in any of the forms of the module's docstring, or None."""
    t = _APPROX.sub("", _plain(text)).strip(" .")
    if not t:
        return None
    if _NUMBER.fullmatch(t) and any(ch.isdigit() for ch in t):
        return float(t.replace(",", ""))
    sci = _SCIENTIFIC.fullmatch(t)
    if sci:
        exponent = (sci[2] or sci[3]).replace("−", "-")
        return float(sci[1].replace("−", "-")) * 10.0 ** int(exponent)
    ordinal = _ORDINAL_SUFFIX.fullmatch(t)
    if ordinal:
        return float(ordinal[1])
    return _words_value(t.lower())


def _words_value(text: str) -> float | None:
    """"two hundred and six" -> 206, "a thousand" -> 1000, "twenty-first" -> 21; None if not all words are numbers."""
    parts = [p for p in re.split(r"[\s-]+", text.replace(",", " ")) if p and p != "and"]
    if not parts:
        return None
    if parts[0] in ("a", "one") and len(parts) > 1 and parts[1] in _SCALES:
        parts[0] = "one"
    total, current, seen = 0, 0, False
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        if p in _UNITS:
            current += _UNITS.index(p)
        elif p in _TENS:
            current += 10 * (_TENS.index(p) + 2)
        elif p in _SCALES:
            scale = _SCALES[p]
            if scale == 100:
                current = max(current, 1) * 100
            else:
                total, current = total + max(current, 1) * scale, 0
        elif last and _ordinal_word(p) is not None:
            current += _ordinal_word(p)
        else:
            return None
        seen = True
    return float(total + current) if seen else None


def _ordinal_word(word: str) -> int | None:
    if word in _ORDINAL_WORDS:
        return _ORDINAL_WORDS[word]
    if word.endswith("ieth") and word[:-4] + "y" in _TENS:
        return 10 * (_TENS.index(word[:-4] + "y") + 2)
    if word.endswith("th") and word[:-2] in _UNITS:
        return _UNITS.index(word[:-2])
    return None


def percent_value(text: str) -> float | None:
    """The number of percent `text` states ("25%", "25 \\%", "25 percent"), or None."""
    m = _PERCENT.match(_plain(text))
    return number_value(m[1]) if m else None


_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_MONTH = r"([A-Za-z]{3,9})\.?"
_DATES = (
    (re.compile(rf"^{_MONTH}\s+{_DAY},?\s+(\d{{3,4}})$"), (2, 1, 3)),  # May 3, 2001
    (re.compile(rf"^(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH},?\s+(\d{{3,4}})$", re.IGNORECASE), (1, 2, 3)),  # 3rd of May 2001
    (re.compile(r"^(\d{4})-(\d{1,2})-(\d{1,2})$"), None),  # 2001-05-03
)


def date_key(text: str) -> str | None:
    """The calendar day `text` names as YYYY-MM-DD, or None."""
    t = _plain(text).strip(" ,")
    for pattern, order in _DATES:
        m = pattern.match(t)
        if not m:
            continue
        if order is None:
            year, month, day = int(m[1]), int(m[2]), int(m[3])
        else:
            day, month_name, year = (m[k] for k in order)
            month = _month(month_name)
            if month is None:
                return None
            day, year = int(day), int(year)
        if 1 <= month <= 12 and 1 <= day <= 31:
            return f"{year:04d}-{month:02d}-{day:02d}"
    return None


def _month(name: str) -> int | None:
    name = name.lower()
    if name in MONTHS:
        return MONTHS.index(name) + 1
    return _MONTH_ABBREVIATIONS.get(name[:4] if name.startswith("sept") else name[:3]) if len(name) <= 5 else None


def boolean_value(text: str) -> bool | None:
    word = _plain(text).lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=max(rel_tol, 1e-9), abs_tol=1e-12)


def same_value(said: str, gold: str, rel_tol: float = 0.0) -> bool:
    """Whether an answer and a reference are the same value in the forms of the module's docstring."""
    said_date = date_key(said)
    if said_date is not None:
        return said_date == date_key(gold)
    said_bool, gold_bool = boolean_value(said), boolean_value(gold)
    if said_bool is not None and gold_bool is not None:
        return said_bool is gold_bool
    gold_number, gold_percent = number_value(gold), percent_value(gold)
    percent = percent_value(said)
    if percent is not None:
        if gold_percent is not None:
            return _close(percent, gold_percent, rel_tol)
        return gold_number is not None and (_close(percent / 100, gold_number, rel_tol)
                                            or _close(percent, gold_number, rel_tol))
    number = number_value(said)
    if number is None:
        return False
    if gold_percent is not None:
        return _close(number, gold_percent / 100, rel_tol) or _close(number, gold_percent, rel_tol)
    return gold_number is not None and _close(number, gold_number, rel_tol)


def gold_variants(gold: str) -> list[str]:
    """The reference in the other forms a statement may name it in (see the module's docstring)."""
    out: list[str] = []
    key = date_key(gold)
    if key is not None:
        y, m, d = (int(x) for x in key.split("-"))
        month = MONTHS[m - 1].capitalize()
        suffix = _suffix(d)
        out += [f"{month} {d}, {y}", f"{month} {d}{suffix}, {y}", f"{d} {month} {y}", f"{d}{suffix} of {month} {y}",
                f"{d}{suffix} {month} {y}", key]
    value = number_value(gold) if key is None else None
    if value is not None and value.is_integer() and 0 <= value < 1_000_000:
        n = int(value)
        if _is_ordinal(gold) and 0 < n < 100:
            out += [f"{n}{_suffix(n)}", ordinal_words(n)]
        out += [str(n), number_words(n)]
        if n >= 1000:
            out.append(f"{n:,}")
    boolean = boolean_value(gold)
    if boolean is not None:
        out.append("correct" if boolean else "incorrect")
    elif value is None and key is None and re.fullmatch(r"[a-z]{3,}", gold.strip()):
        out.append(plural(gold.strip()))  # "kittens" for "kitten"
    return [v for v in dict.fromkeys(out) if v.lower() != gold.lower()]


def plural(noun: str) -> str:
    """The regular plural of a lowercase noun: kitten -> kittens, box -> boxes, city -> cities."""
    if re.search(r"(?:s|x|z|ch|sh)$", noun):
        return noun + "es"
    if re.search(r"[^aeiou]y$", noun):
        return noun[:-1] + "ies"
    return noun + "s"


def _suffix(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _is_ordinal(text: str) -> bool:
    last = _plain(text).lower().split("-")[-1].split()[-1:] or [""]
    return bool(_ORDINAL_SUFFIX.fullmatch(last[0])) or _ordinal_word(last[0]) is not None


def ordinal_words(n: int) -> str:
    """0 < n < 100 as an ordinal word: 3 -> "third", 21 -> "twenty-first", 40 -> "fortieth"."""
    irregular = {v: k for k, v in _ORDINAL_WORDS.items()}
    if n < 20:
        return irregular.get(n) or _UNITS[n] + "th"
    tens, unit = divmod(n, 10)
    if not unit:
        return _TENS[tens - 2][:-1] + "ieth"
    return _TENS[tens - 2] + "-" + ordinal_words(unit)


def number_words(n: int) -> str:
    """0 <= n < 1,000,000 in words: 206 -> "two hundred six", 21 -> "twenty-one"."""
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10 - 2] + ("-" + _UNITS[n % 10] if n % 10 else "")
    if n < 1000:
        return _UNITS[n // 100] + " hundred" + (" " + number_words(n % 100) if n % 100 else "")
    return number_words(n // 1000) + " thousand" + (" " + number_words(n % 1000) if n % 1000 else "")
