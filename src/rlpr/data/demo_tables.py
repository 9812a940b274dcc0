"""The demo tasks' embedded tables: facts, words, names, units and calendars (pure data), read by the
short-answer families (rlpr.data.demo_tasks) and the reasoning families (rlpr.data.reasoning_tasks)."""

from __future__ import annotations

import calendar

# --- embedded fact tables (kept small; every entry was checked to have one obvious answer) ---

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
    "Russia": "Moscow", "Canada": "Ottawa", "Australia": "Canberra", "Brazil": "Brasilia",
    "Argentina": "Buenos Aires", "Mexico": "Mexico City", "Egypt": "Cairo", "Kenya": "Nairobi",
    "Greece": "Athens", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna", "Ireland": "Dublin",
    "Hungary": "Budapest", "the Czech Republic": "Prague", "Turkey": "Ankara",
    "Thailand": "Bangkok", "Vietnam": "Hanoi", "South Korea": "Seoul", "Peru": "Lima",
    "Chile": "Santiago", "Colombia": "Bogota", "Cuba": "Havana", "Iran": "Tehran",
    "Iraq": "Baghdad", "the Philippines": "Manila", "Belgium": "Brussels", "Ukraine": "Kyiv",
    "Morocco": "Rabat", "Nigeria": "Abuja", "Ethiopia": "Addis Ababa",
    "Saudi Arabia": "Riyadh", "Pakistan": "Islamabad", "New Zealand": "Wellington",
    "the United Kingdom": "London", "Iceland": "Reykjavik", "Romania": "Bucharest",
    "Venezuela": "Caracas",
}

ELEMENT_SYMBOLS = {
    "hydrogen": "H", "helium": "He", "lithium": "Li", "carbon": "C", "nitrogen": "N",
    "oxygen": "O", "fluorine": "F", "neon": "Ne", "sodium": "Na", "magnesium": "Mg",
    "aluminum": "Al", "silicon": "Si", "phosphorus": "P", "sulfur": "S", "chlorine": "Cl",
    "argon": "Ar", "potassium": "K", "calcium": "Ca", "iron": "Fe", "nickel": "Ni",
    "copper": "Cu", "zinc": "Zn", "silver": "Ag", "tin": "Sn", "iodine": "I", "gold": "Au",
    "mercury": "Hg", "lead": "Pb", "uranium": "U",
}

# Directed pairs: "light" -> ? or "lose" -> ? have two fair answers, so only one direction is kept.
ANTONYMS = {
    "hot": "cold", "cold": "hot", "up": "down", "down": "up", "fast": "slow", "slow": "fast",
    "happy": "sad", "sad": "happy", "day": "night", "night": "day", "early": "late",
    "full": "empty", "empty": "full", "wet": "dry", "dry": "wet", "tall": "short",
    "long": "short", "rich": "poor", "poor": "rich", "strong": "weak", "weak": "strong",
    "push": "pull", "pull": "push", "win": "lose", "true": "false", "false": "true",
    "above": "below", "below": "above", "inside": "outside", "outside": "inside",
    "heavy": "light", "dark": "light", "buy": "sell", "sell": "buy", "love": "hate",
    "hate": "love", "black": "white", "white": "black", "north": "south", "south": "north",
    "east": "west", "west": "east", "first": "last", "before": "after", "after": "before",
    "remember": "forget", "forget": "remember", "friend": "enemy", "enemy": "friend",
    "always": "never", "never": "always", "increase": "decrease", "decrease": "increase",
    "asleep": "awake", "awake": "asleep", "clean": "dirty", "dirty": "clean",
    "cheap": "expensive", "expensive": "cheap", "young": "old", "maximum": "minimum",
    "minimum": "maximum", "inhale": "exhale", "exhale": "inhale", "odd": "even",
    "positive": "negative", "negative": "positive", "possible": "impossible",
    "visible": "invisible", "forward": "backward", "top": "bottom", "bottom": "top",
    "sunrise": "sunset", "sunset": "sunrise", "male": "female", "female": "male",
    "big": "small", "small": "big", "open": "closed", "closed": "open",
}

PLURALS = {
    "child": "children", "mouse": "mice", "foot": "feet", "tooth": "teeth", "goose": "geese",
    "man": "men", "woman": "women", "ox": "oxen", "leaf": "leaves", "knife": "knives",
    "wife": "wives", "wolf": "wolves", "half": "halves", "loaf": "loaves", "shelf": "shelves",
    "thief": "thieves", "calf": "calves", "life": "lives", "box": "boxes", "bus": "buses",
    "fox": "foxes", "church": "churches", "dish": "dishes", "glass": "glasses",
    "watch": "watches", "city": "cities", "baby": "babies", "story": "stories",
    "lady": "ladies", "party": "parties", "potato": "potatoes", "tomato": "tomatoes",
    "hero": "heroes", "sheep": "sheep", "deer": "deer", "moose": "moose", "crisis": "crises",
    "criterion": "criteria", "phenomenon": "phenomena", "cat": "cats", "key": "keys",
    "toy": "toys",
}

COLORS = {
    "the sky on a clear day": "blue", "fresh grass": "green", "fresh snow": "white",
    "coal": "black", "blood": "red", "a ripe banana": "yellow", "a ripe lemon": "yellow",
    "milk": "white", "a ripe tomato": "red", "a carrot": "orange", "milk chocolate": "brown",
    "a lime": "green", "an emerald": "green", "a ruby": "red", "a crow": "black",
    "a flamingo": "pink", "a ripe strawberry": "red", "a pumpkin": "orange",
    "an egg yolk": "yellow", "a polar bear's fur": "white", "a stop sign": "red",
    "a school bus in the United States": "yellow",
}

ANIMAL_SOUNDS = {
    "moo": "cow", "oink": "pig", "baa": "sheep", "meow": "cat", "woof": "dog", "quack": "duck",
    "neigh": "horse", "cluck": "chicken", "hoot": "owl", "ribbit": "frog", "gobble": "turkey",
    "cock-a-doodle-doo": "rooster", "hee-haw": "donkey", "squeak": "mouse", "caw": "crow",
}

LANGUAGES = {
    "France": "French", "Germany": "German", "Italy": "Italian", "Spain": "Spanish",
    "Portugal": "Portuguese", "Brazil": "Portuguese", "Japan": "Japanese", "Russia": "Russian",
    "Greece": "Greek", "Poland": "Polish", "the Netherlands": "Dutch", "Sweden": "Swedish",
    "Norway": "Norwegian", "Denmark": "Danish", "Turkey": "Turkish", "Mexico": "Spanish",
    "Argentina": "Spanish", "Hungary": "Hungarian", "South Korea": "Korean", "Thailand": "Thai",
    "Vietnam": "Vietnamese", "Iran": "Persian", "Egypt": "Arabic", "Saudi Arabia": "Arabic",
    "the Czech Republic": "Czech", "Ukraine": "Ukrainian", "Israel": "Hebrew", "China": "Chinese",
}

# Other spellings or names a grader should also accept, keyed by the reference answer.
ALIASES = {
    "Brasilia": ["Brasília"], "Bogota": ["Bogotá"], "Kyiv": ["Kiev"], "Reykjavik": ["Reykjavík"],
    "aluminum": ["aluminium"], "sulfur": ["sulphur"], "small": ["little"], "big": ["large"],
    "closed": ["shut"], "backward": ["backwards"], "chicken": ["hen"], "rooster": ["cockerel"],
    "Persian": ["Farsi"], "Chinese": ["Mandarin"], "woof": ["bark", "bow-wow"], "meow": ["miaow", "mew"],
    "oink": ["grunt"], "baa": ["bleat"], "neigh": ["whinny"], "hee-haw": ["bray"], "ribbit": ["croak"],
}

# (unit asked for, unit given, how many of the first are in one of the second)
UNIT_FACTORS = [
    ("centimeters", "meters", 100), ("millimeters", "centimeters", 10),
    ("meters", "kilometers", 1000), ("grams", "kilograms", 1000),
    ("milliliters", "liters", 1000), ("inches", "feet", 12), ("minutes", "hours", 60),
    ("seconds", "minutes", 60), ("hours", "days", 24), ("days", "weeks", 7),
    ("months", "years", 12),
]

WEEKDAYS = list(calendar.day_name)  # Monday .. Sunday
MONTHS = list(calendar.month_name)[1:]  # January .. December

COUNT_WORDS = [
    "banana", "apple", "letter", "balloon", "coffee", "committee", "bookkeeper", "pepper",
    "success", "address", "tomato", "potato", "elephant", "giraffe", "umbrella", "window",
    "garden", "kitchen", "pencil", "computer", "mountain", "river", "bottle", "cheese",
    "butter", "rabbit", "dinner", "paper", "summer", "winter", "teacher", "doctor", "school",
    "orange", "lemon", "cherry", "chocolate", "bicycle", "library", "television", "teapot",
    "cabbage", "penguin", "dolphin", "octopus", "volcano", "rainbow", "pyramid",
    "hammer", "ladder", "mirror", "pillow", "blanket", "candle", "guitar", "piano", "violin",
    "jacket", "bread", "honey", "onion", "island", "forest", "desert", "planet", "rocket",
]

SORT_WORDS = [
    "apple", "pear", "fig", "plum", "grape", "lime", "kiwi", "mango", "peach", "melon",
    "cat", "dog", "owl", "fox", "bear", "lion", "wolf", "deer", "duck", "frog", "goat",
    "hat", "cup", "pen", "book", "desk", "lamp", "door", "rug", "sock", "boat",
]

NAMES = [("Tom", "he"), ("Mia", "she"), ("Sam", "he"), ("Lily", "she"), ("Ben", "he"),
         ("Emma", "she"), ("Max", "he"), ("Zoe", "she"), ("Leo", "he"), ("Ava", "she")]
ITEMS = ["apples", "pencils", "stickers", "marbles", "books", "cookies", "balloons", "cards",
         "shells", "coins"]

VOWELS = "aeiou"
