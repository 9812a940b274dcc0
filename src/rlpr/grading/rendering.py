"""What a reader of the rendered response sees, the text every grader reads (issue 59, items 3 and 4).

A response is read as markdown/HTML shows it: text that is never rendered is no answer (an HTML
comment `<!-- answer: B -->`, a `<script>`/`<style>`/`<template>` block, an element marked `hidden`
or `display: none`, a markdown comment `[//]: # (B)`, zero-width characters). Then characters that
look alike read alike: Unicode NFKC (full-width "Ｂ" is "B", "CO₂" is "CO2"; a superscript is kept as
a power first, "x²" -> "x^{2}") and a look-alike letter from another script (Cyrillic "В", Greek
"Β") standing alone or inside a Latin word is the Latin letter. A word written wholly in another
script stays as written ("Москва").
"""

from __future__ import annotations

import re
import unicodedata

_HIDDEN = (
    re.compile(r"<!--.*?(?:-->|\Z)", re.DOTALL),  # an unclosed comment hides the rest
    re.compile(r"<(script|style|template|noscript)\b[^>]*>.*?(?:</\1\s*>|\Z)", re.DOTALL | re.IGNORECASE),
    re.compile(r"<(\w+)\b[^>]*?(?:\bhidden\b|display\s*:\s*none|visibility\s*:\s*hidden)[^>]*>.*?(?:</\1\s*>|\Z)",
               re.DOTALL | re.IGNORECASE),
    re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*(?:#|<>)[ \t]*(?:\(.*\)|\".*\"|'.*')?[ \t]*$", re.MULTILINE),
)
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"))
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+")
# Letters of other scripts that look like a Latin letter (Unicode's confusables for A-Z / a-z).
_LOOK_ALIKES = str.maketrans(
    "АВСЕНІЈКМОРЅТХҮаеіјорсхуѕԁԛԝ" "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧον",
    "ABCEHIJKMOPSTXYaeijopcxysdqw" "ABEZHIKMNOPTYXov")
_LOOK_ALIKE_CHARS = "АВСЕНІЈКМОРЅТХҮаеіјорсхуѕԁԛԝΑΒΕΖΗΙΚΜΝΟΡΤΥΧον"
_WORD = re.compile(r"[^\W\d_]+")


def visible(response: str) -> str:
    """The response as a reader sees it (see the module's docstring)."""
    text = response
    for pattern in _HIDDEN:
        text = pattern.sub("", text)
    text = text.translate(_INVISIBLE)
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}", text)
    text = unicodedata.normalize("NFKC", text).replace("\u2044", "/")
    return _WORD.sub(_fold_word, text)


def _fold_word(m: re.Match) -> str:
    """A word of look-alike letters alone ("В") or mixed into Latin letters ("Pаris") is Latin."""
    word = m.group()
    if not any(ch in _LOOK_ALIKE_CHARS for ch in word):
        return word
    latin = any("a" <= ch.lower() <= "z" for ch in word)
    return word.translate(_LOOK_ALIKES) if latin or len(word) == 1 else word
