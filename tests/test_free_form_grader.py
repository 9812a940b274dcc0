"""The free-form grader against people (issue 28): the forms the issue names, the hand-labeled
set (tests/data/grading/labeled_responses.jsonl: precision and recall of `correct` >= 0.97), and
the ways a response could game a lenient grader (lists, hedges, echoes, negations, many words)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from rlpr.grading import GRADER_VERSION, grade_short_answer

pytestmark = pytest.mark.unit

LABELED = Path(__file__).parent / "data" / "grading" / "labeled_responses.jsonl"


def short_id(value):
    return repr(value)[:50] if isinstance(value, str) else None


# --------------------------------------------------------------------------- the issue's forms

@pytest.mark.parametrize("question, reference, response", [
    # the answer followed by a qualifier or a place
    ("In which city is the Eiffel Tower?", "Paris",
     "The Eiffel Tower is located in the city of Paris, France."),
    ("What is the highest mountain in the world?", "Mount Everest",
     "The highest mountain in the world is Mount Everest, Nepal's highest peak."),
    # a parenthetical
    ("What is the currency of the United States?", "US dollar",
     "The currency of the United States is the US dollar (USD)."),
    ("Which gas makes up most of Earth's atmosphere?", "nitrogen",
     "Most of Earth's atmosphere is nitrogen (N2)."),
    # the answer first
    ("Which organ pumps blood through the body?", "heart",
     "The heart is the main organ that pumps blood through the body."),
    # a number before its unit
    ("How many hours are in a day?", "24", "There are 24 hours in a day."),
    # a quoted answer whose period sits inside the quotes, more text after
    ("What is the plural of the noun 'person'?", "people",
     'The plural of "person" is "people." This is a grammatical rule that applies to most nouns.'),
], ids=short_id)
def test_the_issues_correct_forms_are_accepted(question, reference, response):
    grade = grade_short_answer(response, reference, None, question)
    assert grade.correct, grade


@pytest.mark.parametrize("question, reference, response", [
    ("What is the main language spoken in Brazil?", "Portuguese",
     "The main language spoken in Brazil is predominantly Spanish, with a significant minority of "
     "Portuguese."),
    ("How many days are in a week?", "7", "There are 7 leap years in a year."),
], ids=short_id)
def test_the_issues_wrong_answers_are_rejected(question, reference, response):
    grade = grade_short_answer(response, reference, None, question)
    assert not grade.correct, grade


# --------------------------------------------------------------------------- the labels' forms

@pytest.mark.parametrize("question, reference, acceptable, response", [
    ("Which chemical element has the symbol Ca?", "calcium", None, "Calcium is a chemical element named Ca."),
    ("Who wrote the novel \"Don Quixote\"?", "Miguel de Cervantes", ["Cervantes"],
     "The novel \"Don Quixote\" by Miguel de Cervantes is a classic Spanish novel."),
    ("Kabul is the capital of which country?", "Afghanistan", None,
     "The capital of Afghanistan is Kabul."),
    ("What is the capital of Croatia?", "Zagreb", None,
     "The capital of Croatia is Zagreb, also known as the city of Brebbia."),
    ("What is the main language spoken in Romania?", "Romanian", None,
     "The main language spoken in Romania is Romanian and is closely related to Hungarian."),
    ("What is the SI unit of force?", "newton", ["newtons"], "The SI unit of force is Newtons (N)."),
    ("What is the SI unit of electric current?", "ampere", ["amperes", "amp"],
     "The current in electricity is measured in units called amperes or AMP."),
    ("What is the opposite of the word 'open'?", "closed", None,
     "The opposite of the word \"open\" is \"closed\" or \"closed-ended.\""),
    ("What is the chemical symbol for aluminum?", "Al", None,
     "Aluminum is a chemical element with the chemical symbol (Al) and it is a naturally occurring metal."),
    ("Who wrote the Harry Potter books?", "J. K. Rowling", ["J.K. Rowling"],
     "The Harry Potter books were written by J.K. Rowling."),
    ("In which US city was President John F. Kennedy assassinated?", "Dallas", None,
     "President John F. Kennedy was assassinated on November 22, 1963, in Dallas, Texas."),
    ("In which year was the United States Declaration of Independence adopted?", "1776", None,
     "The Declaration of Independence was adopted on July 4, 1776 by the Second Continental Congress."),
    ("What is the main language spoken in Finland?", "Finnish", None,
     "Finland is a Scandinavian country with a rich culture. The official language is Finnish, which is "
     "related to Estonian."),
    ("Which river flows through Vienna, Budapest and Belgrade?", "Danube", ["Danube River"],
     "The Danube River, one of the longest rivers in Europe, flows through Vienna, Budapest and Belgrade."),
    ("Which acid is found in the human stomach?", "hydrochloric acid", None,
     "The stomach holds many acids, including hydrochloric acid, which is the main acid of the stomach."),
    ("Tom has 5 apples and gets 3 more. How many apples does he have now?", "8", None,
     "Tom has 5 apples and gets 3 more, so he has 8 apples now."),
    ("Which gas makes up most of Earth's atmosphere?", "nitrogen", None,
     "The atmosphere is made of nitrogen (N2) and oxygen (O2). However, nitrogen is the most abundant gas."),
    ("At what temperature, in degrees Celsius, does pure water freeze at sea level?", "0", None,
     "At sea level, pure water freezes at 0 degrees Celsius."),
    ("What is the singular of the noun 'shelves'?", "shelf", None, "a single shelf"),
    ("What is the pH of pure water at 25 degrees Celsius?", "7", None,
     "At 25 degrees Celsius, pure water has a pH of 7."),
    ("What is the chemical formula of carbon dioxide?", "CO2", None,
     "The chemical formula of carbon dioxide isCarbon dioxide (CO2)."),
    ("What is the main language spoken in Armenia?", "Armenian", None,
     "The main language spoken in Armenia is East Armenian."),
    # grader version 3: a coordinated clause, an opening phrase mirroring the question's, a year
    # after its month, emphatic "do", a function word that ends the phrase
    ("What is the plural of the noun 'bus'?", "buses", None,
     "The noun 'bus' is a noun, and the plural form is 'buses'."),
    ("In which sport is the term \"home run\" used?", "baseball", None,
     "In baseball, the term \"home run\" is used during Catalina Stadium games."),
    ("In which country is Machu Picchu?", "Peru", None,
     "In Southern Peru, specifically Machu Picchu is the inhabited location of the Incas."),
    ("In which year did humans first land on the Moon?", "1969", None,
     "Humans first landed on the Moon in July 1969, after the Apollo missions."),
    ("What gas do humans need to breathe to stay alive?", "oxygen", ["O2"], "We humans do need oxygen to survive."),
    ("What is the plural of the noun 'tooth'?", "teeth", None,
     "The plural of the noun 'tooth' is, of course, 'teeth' (adjectival plural of \"tooth\")."),
    ("What is the main language spoken in Romania?", "Romanian", None,
     "The language in Romania is Romanian. However, in languages spoken by a minority of migrants, Latin is used."),
    ("What is the main language spoken in Germany?", "German", None,
     "Mainland Germany predominantly speaks German due to migration across Europe."),
], ids=short_id)
def test_forms_people_accept(question, reference, acceptable, response):
    grade = grade_short_answer(response, reference, acceptable, question)
    assert grade.correct, grade


@pytest.mark.parametrize("question, reference, response", [
    ("What is the singular of the noun 'cacti'?", "cactus",
     "The singular of the noun 'cactus' is cacti."),
    ("Which chemical element has the symbol Kr?", "krypton",
     "The chemical element with the symbol Kr is Kr."),
    ("What is the plural of the noun 'bench'?", "benches",
     "The noun \"bench\" is \"bench\", it's the plural form of \"bench\" (Benches!)."),
    ("What is the opposite of the word 'majority'?", "minority",
     "The opposite of \"majority\" is \"minority.\" However, technically, the opposite of \"majority\" is "
     "\"non-majority.\""),
    ("Who was the first emperor of Rome?", "Augustus", "The first emperor of Rome was Romulus Augustus."),
    ("What is the name of the puzzle cube invented by Erno Rubik?", "Rubik's Cube",
     "The puzzle cube is called the Mirror Cube by the creators of the Rubik's Cube."),
    ("How many weeks are in a fortnight?", "2", "There are 14 days in 2 weeks."),
    ("What is the capital of France?", "Paris", "France is the capital of Paris."),
    ("Which animal says 'neigh'?", "horse", "The horse says moo."),
    ("What is the main language spoken in Finland?", "Finnish",
     "Finnish might be the main language spoken in Finland."),
    ("Which country gave the Statue of Liberty to the United States?", "France",
     "The Statue of Liberty is a symbol of the United States, and it was a gift from the United States to "
     "the people of France."),
    ("In which sport is the term 'home run' used?", "baseball", "In cricket or baseball, the term home run is used."),
    ("In which sport is the term 'home run' used?", "baseball", "In baseball, a strike is called."),
    ("In which year did humans first land on the Moon?", "1969", "In 1969, humans did not land on the Moon."),
    ("What is the opposite of the word 'narrow'?", "wide",
     'The opposite of "narrow" is "wide" or "wide-beamed" or "great-joyful" or simply "awesome."'),
    ("What is the capital of France?", "Paris", "The capital of France is Berlin, and Paris is its largest city."),
], ids=short_id)
def test_the_reference_in_a_wrong_role_is_rejected(question, reference, response):
    grade = grade_short_answer(response, reference, None, question)
    assert not grade.correct, grade


# --------------------------------------------------------------------------- still hard to game

CAPITAL = "What is the capital of France?"


@pytest.mark.parametrize("response", [
    # several candidates
    "Paris or Berlin", "Berlin or Paris", "Rome, Berlin, Paris", "Paris, Berlin, Rome, Madrid",
    "The capital of France is Paris, Berlin.", "The capital of France is either Paris or Berlin.",
    "The capital of France is Paris (or Berlin).", "It is K2 or Paris, which are both nice.",
    "The capital of France is one of London, Paris and Berlin.",
    # many words
    "Berlin Rome Madrid Paris", "The capital of France is Berlin Madrid Rome Paris.",
    "London Paris Berlin Rome Madrid Lisbon Vienna Prague Warsaw Athens Dublin Oslo",
    # hedged, negated
    "The capital of France might be Paris.", "The capital of France is probably Paris.",
    "The capital of France is not Paris.", "Paris is not the capital of France.",
    "Paris might be the capital of France.",
    # another answer first, the question echoed or asked back
    "The capital of France is Berlin. Paris is the capital of France.",
    "The capital of France is Berlin near Paris.", "What is the capital of France?",
    "What is the capital of France", "Is it Paris?", "Vienna. The capital of France is Paris.",
    "Berlin Paris", "Paris, Berlin, Rome: one of these is the capital of France.",
    # the reference only in another role
    "Paris is a nice city.", "Paris Hilton is the capital of France.",
], ids=short_id)
def test_gaming_forms_are_rejected(response):
    grade = grade_short_answer(response, "Paris", None, CAPITAL)
    assert not grade.correct, grade


@pytest.mark.parametrize("response", [
    "The capital of France is Paris.", "Paris is the capital of France.", "Paris.",
    "The capital of France is Paris, France.", "Sure! The capital of France is Paris. It is lovely.",
    "France's capital city is Paris, which lies on the Seine.", "Paris, of course.",
    "The capital of France is Paris or Paris.", "Paris. It is the capital.", "Paris Paris Paris",
    "Hmm. Paris is the capital of France.",
], ids=short_id)
def test_plain_answers_stay_correct(response):
    grade = grade_short_answer(response, "Paris", None, CAPITAL)
    assert grade.correct, grade


def _calls(response: str) -> int:
    """Python and C function calls one grading makes: a count of the grader's work that, unlike its
    wall-clock time, does not depend on the machine or what else runs on it."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(count)
    try:
        grade_short_answer(response, "Paris", None, CAPITAL)
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize("unit", ["Paris, ", "Paris ", "Paris and ", "very ", "("], ids=short_id)
def test_degenerate_text_costs_linear_work(unit):
    """Degenerate repetition once made the guards quadratic ('Paris, ' * 900 took 3.3 s): a statement
    is read up to 200 tokens and its first 10 mentions. Ten times the text may cost at most about ten
    times the calls (without the caps 'Paris, ' costs 1,100 times, 'Paris ' 40 times)."""
    def text(repeats: int) -> str:
        body = unit * repeats
        return f"The capital of France is {body}Paris." if unit == "very " else body

    assert _calls(text(1000)) <= 12 * _calls(text(100))


def test_the_grader_version_says_the_verdicts_changed():
    assert GRADER_VERSION == 6


# --------------------------------------------------------------------------- the labeled set

def _half(row_id: str) -> str:
    """The deterministic split of benchmarks/grader_consistency.py: sha256(id) even -> dev."""
    return "dev" if hashlib.sha256(row_id.encode()).digest()[-1] % 2 == 0 else "held"


def _scores(rows) -> tuple[float, float]:
    tp = fp = fn = 0
    for r in rows:
        said = grade_short_answer(r["response"], r["reference"], r["aliases"] or None, r["question"]).correct
        truth = r["label"] == "correct"
        tp += said and truth
        fp += said and not truth
        fn += truth and not said
    return tp / (tp + fp), tp / (tp + fn)


def test_the_free_form_grader_agrees_with_people():
    rows = [json.loads(line) for line in LABELED.read_text().splitlines() if line.strip()]
    scored = [r for r in rows if r["label"] != "ambiguous"]
    assert len(rows) == 666 and len(scored) == 648
    precision, recall = _scores(scored)
    assert precision >= 0.97 and recall >= 0.97, (precision, recall)
    for half in ("dev", "held"):
        precision, recall = _scores([r for r in scored if _half(r["id"]) == half])
        assert precision >= 0.95 and recall >= 0.95, (half, precision, recall)


@pytest.mark.parametrize("name, min_precision, min_recall", [
    # blind for version 2: 0.952 / 0.870; version 3 0.977 / 0.924; version 4 refuses two rows labeled
    # correct that offer two candidates ('"happy" or "overjoyed"', '"never" or "not at all"'): 0.902
    ("fresh_labeled_responses.jsonl", 0.97, 0.90),
    ("fresh2_labeled_responses.jsonl", 0.95, 0.76),  # blind for version 3 as first written: 0.944 / 0.654
    ("fresh3_labeled_responses.jsonl", 0.99, 0.95),  # blind for version 4: 1.000 / 0.962
    # issue 59's fresh set, blind for version 5: 0.894 / 0.778; version 6: 1.000 / 0.963
    ("fresh4_labeled_responses.jsonl", 0.95, 0.95),
])
def test_the_fresh_sets_do_not_regress(name, min_precision, min_recall):
    """The fresh sets were blind once (tests/data/grading/README.md); now read, they guard against
    a rule that loses what the grader already reads right."""
    rows = [json.loads(line) for line in (LABELED.parent / name).read_text().splitlines() if line.strip()]
    precision, recall = _scores([r for r in rows if r["label"] != "ambiguous"])
    assert precision >= min_precision and recall >= min_recall, (precision, recall)


# Issue 59: statement forms of fresh set 4 that version 5 read wrong, each a class (v5 credited the
# wrong ones and refused the right ones).
@pytest.mark.parametrize("question, reference, response, correct", [
    ("In which mountain range is Mount Everest?", "Himalayas",
     "Mount Everest is located in South Asia, specifically in the Himalayas.", True),  # a refinement
    ("What instrument is used to measure temperature?", "thermometer",
     "The instrument used to measure temperature is nothing but a thermometer specifically designed for it.", True),
    ("What is the longest river in Africa?", "Nile River",
     "The Nile River, also known as the Nile Aqua in Egypt, is Africa's longest river.", True),  # an alias apposition
    ("What is the currency of the United Kingdom?", "pound sterling",
     "The United Kingdom has its own currency, which is the Pound Sterling.", True),
    ("What is a young cat called?", "kitten", "Furry little kitties are called kittens.", True),
    ("What instrument is used to measure atmospheric pressure?", "barometer",
     "A barometer uses atmospheric pressure measurement to measure air molecules.", True),
    ("In which US city was President John F. Kennedy assassinated?", "Dallas",
     "The assassination of President John F. Kennedy occurred on Feb. 14, 1963, in Dallas, Texas.", True),
    ("What is the SI unit of electric current?", "ampere", "The SI unit of electric current is ampeère (A).", True),
    ("What is the main ingredient of hummus?", "chickpeas",
     "The main ingredient of hummus is often called mokuzi but is actually the combination of chickpeas and oil.", True),
    ("How many letters are in the English alphabet?", "26",
     "The answer is 26, but in English, some letters are counted as two different words.", True),
    ("What is the longest river in South America?", "Amazon",
     "The shortest river in South America is the Amazon River.", False),  # the opposite superlative
    ("What is 81 divided by 9?", "9", "81 divided by 9 is 11 with a remainder of 6.", False),
    ('Who wrote the play "Hamlet"?', "William Shakespeare",
     "The tragedy by William Shakespeare was written by the Scottish playwright Robert Kenny.", False),
    ("Which blood cells carry oxygen around the body?", "erythrocytes",
     "Blood cells called erythrocytes do not carry oxygen.", False),
    ("What is the main language spoken in Bulgaria?", "Bulgarian", "Bulgaria speaks Latin.", False),
    ("What do bees make from nectar?", "honey", "Bees make food using honey specifically - honeydew.", False),
    ("What is the singular of the noun 'dishes'?", "dish", "The singular of the noun 'dishes' is 'dishes'.", False),
    ("What is the singular of the noun 'churches'?", "church",  # a refiner before a verb restarts nothing
     'This is a recurrent fallacy, specifically referred to as "undeclared church."', False),
])
def test_statement_forms_of_fresh_set_4(question, reference, response, correct):
    assert grade_short_answer(response, reference, None, question).correct is correct
