"""English text normalisation by rules: numbers, money, dates, times, percentages, ordinals,
units and common abbreviations written out as words, the words from num2words.

A rule is a regular expression and a function that writes its match as words; the rules run in
order over the text, so a date is read as a date before its numbers are read as numbers. It
covers the written forms a corpus of plain sentences mostly holds (`$12.50`, `3/4/2025`,
`10:30 a.m.`, `20%`, `5th`, `3.5 kg`, `Dr.`); NeMo's grammars (`text.normalizer: nemo`) cover
far more (telephone numbers, addresses, roman numerals, context-dependent readings).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "€": ("euro", "euros", "cent", "cents"),
              "£": ("pound", "pounds", "penny", "pence"), "¥": ("yen", "yen", "sen", "sen")}
UNITS = {"kg": "kilograms", "g": "grams", "mg": "milligrams", "km": "kilometers", "m": "meters",
         "cm": "centimeters", "mm": "millimeters", "mi": "miles", "ft": "feet", "in": "inches",
         "lb": "pounds", "lbs": "pounds", "oz": "ounces", "l": "liters", "ml": "milliliters",
         "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "kb": "kilobytes",
         "mb": "megabytes", "gb": "gigabytes", "tb": "terabytes", "mph": "miles per hour",
         "km/h": "kilometers per hour", "°c": "degrees Celsius", "°f": "degrees Fahrenheit"}
ATTACHED_ONLY = {"m", "s", "h", "g", "l", "in", "min", "mi"}  # also words: a unit only when written "5m"
ABBREVIATIONS = {"Mr.": "mister", "Mrs.": "missus", "Ms.": "miss", "Dr.": "doctor", "Prof.": "professor",
                 "Jr.": "junior", "Sr.": "senior", "vs.": "versus", "etc.": "et cetera",
                 "e.g.": "for example", "i.e.": "that is", "approx.": "approximately"}
SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at ", "#": " number "}


def words(number: int | str) -> str:
    """A number in words without num2words' commas and hyphens ("one thousand two hundred
    and thirty four"): a pause or a hyphen inside a number reads badly. Decimals are read
    digit by digit after the point ("two point zero five")."""
    whole, _, digits = str(number).partition(".")
    said = num2words(int(whole), lang="en").replace(",", "").replace("-", " ")
    if whole.startswith("-0"):
        said = "minus " + said
    point = " point" + "".join(f" {num2words(int(d), lang='en')}" for d in digits) if digits else ""
    return said + point


def year(value: int) -> str:
    return num2words(value, lang="en", to="year").replace("-", " ")


def ordinal(value: int) -> str:
    return num2words(value, lang="en", to="ordinal").replace("-", " ").replace(",", "")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _plural(n: int, one: str, many: str) -> str:
    return f"{words(n)} {one if n == 1 else many}"


def _money(m: re.Match) -> str:
    one, many, cent, cents = CURRENCIES[m["sym"]]
    whole = _int(m["whole"])
    frac = int((m["frac"] or "0").ljust(2, "0")[:2])
    scale = f" {m['scale']}" if m["scale"] else ""
    if scale:  # "$1.5 million": the amount is a decimal number of millions
        return f"{words(m['whole'].replace(',', '') + ('.' + m['frac'] if m['frac'] else ''))}{scale} {many}"
    parts = [_plural(whole, one, many)] if whole or not frac else []
    if frac:
        parts.append(_plural(frac, cent, cents))
    return " and ".join(parts)


def _date(m: re.Match) -> str:
    month, day, value = int(m["m"]), int(m["d"]), int(m["y"])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return m[0]
    value = value + 2000 if len(m["y"]) == 2 else value  # 3/4/25: this century
    return f"{MONTHS[month - 1]} {ordinal(day)} {year(value)}"


def _time(m: re.Match) -> str:
    hour, minute = int(m["h"]), int(m["min"] or 0)
    if hour > 24 or minute > 59:
        return m[0]
    said = words(hour) + ("" if minute == 0 and m["ampm"] else " o'clock" if minute == 0
                          else f" oh {words(minute)}" if minute < 10 else f" {words(minute)}")
    suffix = {"a": " a m", "p": " p m"}.get((m["ampm"] or "").lower()[:1], "")
    rest = m.string[m.end():]
    # "at 5 p.m." ending a sentence keeps its full stop; "5 p.m. and" loses the abbreviation's
    ends = m[0].endswith(".") and (not rest.strip() or re.match(r"\s+[A-Z\n]", rest))
    return said + suffix + ("." if ends else "")


def _unit(m: re.Match) -> str:
    unit = UNITS[m["unit"].lower()]
    amount = m["num"].replace(",", "")
    if amount == "1":
        unit = {"feet": "foot", "inches": "inch"}.get(unit, unit.rstrip("s") if unit.endswith("s") else unit)
    return f"{words(amount)} {unit}"


def _percent(m: re.Match) -> str:
    return f"{words(m['num'].replace(',', ''))} percent"


def _ordinal(m: re.Match) -> str:
    return ordinal(_int(m["num"]))


def _year(m: re.Match) -> str:
    return f"{m['prep']} {year(int(m['y']))}"


def _month_day(m: re.Match) -> str:
    month = next(name for name in MONTHS if name.lower().startswith(m["mon"].lower()[:3]))
    said = f"{month} {ordinal(int(m['d']))}"
    return f"{said} {year(int(m['y']))}" if m["y"] else said


def _number(m: re.Match) -> str:
    said = words(m[0].replace(",", ""))
    # "42B", "B42": keep the word apart from the letters beside it
    before = " " if m.start() > 0 and m.string[m.start() - 1].isalpha() else ""
    after = " " if m.end() < len(m.string) and m.string[m.end()].isalpha() else ""
    return before + said + after


_NUM = r"\d{1,3}(?:,\d{3})+|\d+"


def _names(units) -> str:
    return "|".join(sorted((re.escape(u) for u in units), key=len, reverse=True))


_MONTH_NAMES = "|".join([*MONTHS, "Sept", *(m[:3] for m in MONTHS)])
_AMOUNT = r"(?P<num>(?:" + _NUM + r")(?:\.\d+)?)"
RULES: list[tuple[re.Pattern, Callable[[re.Match], str]]] = [
    (re.compile(r"(?P<sym>[$€£¥])\s?(?P<whole>" + _NUM + r")(?:\.(?P<frac>\d+))?"
                r"(?:\s(?P<scale>thousand|million|billion|trillion)\b)?"), _money),
    (re.compile(r"\b(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})\b"), _date),
    (re.compile(r"\b(?P<mon>" + _MONTH_NAMES + r")\.?\s(?P<d>\d{1,2})(?:st|nd|rd|th)?\b"
                r"(?:,?\s(?P<y>1[1-9]\d\d|20\d\d)\b)?"), _month_day),
    (re.compile(r"\b(?P<m>\d{1,2})/(?P<d>\d{1,2})/(?P<y>\d{4}|\d{2})\b"), _date),
    (re.compile(r"\b(?P<h>\d{1,2}):(?P<min>\d{2})(?:\s?(?P<ampm>[ap]\.?\s?m\b\.?))?", re.I), _time),
    (re.compile(r"\b(?P<h>\d{1,2})(?P<min>)\s?(?P<ampm>[ap]\.?\s?m\b\.?)", re.I), _time),
    (re.compile(_AMOUNT + r"\s?%"), _percent),
    (re.compile(r"\b(?P<num>" + _NUM + r")(?:st|nd|rd|th)\b"), _ordinal),
    (re.compile(_AMOUNT + r"\s?(?P<unit>" + _names(set(UNITS) - ATTACHED_ONLY) + r")(?![\w/])", re.I), _unit),
    (re.compile(_AMOUNT + r"(?P<unit>" + _names(ATTACHED_ONLY) + r")(?![\w/])", re.I), _unit),
    (re.compile(r"\b(?P<prep>[Ii]n|since|from|until|by|during|of)\s(?P<y>1[1-9]\d\d|20\d\d)\b(?![.,]\d)"), _year),
    (re.compile(r"(?<![\w.])-?(?:" + _NUM + r")(?:\.\d+)?|(?<=\w)(?:" + _NUM + r")(?:\.\d+)?"), _number),
]
_ABBREVIATION = re.compile(r"(?<!\w)(" + "|".join(re.escape(a) for a in ABBREVIATIONS) + r")(?=\s|$)")
_SYMBOL = re.compile("|".join(re.escape(s) for s in SYMBOLS))
_SPACES = re.compile(r"[ \t]+")


def normalize_english(text: str) -> str:
    """`text` with its numbers, money, dates, times, percentages, ordinals, units,
    abbreviations and symbols written out as English words."""
    text = _ABBREVIATION.sub(lambda m: ABBREVIATIONS[m[1]], text)
    for pattern, say in RULES:
        text = pattern.sub(say, text)
    text = _SYMBOL.sub(lambda m: SYMBOLS[m[0]], text)
    return _SPACES.sub(" ", text).strip()
