"""Generate `corpus.txt`, the English text the ``lm_bandit`` task reads (docs/tasks.md).

The corpus is written by this script, not copied from anywhere: a small grammar of simple
English sentences (narration, dialogue, counting, calendars, weather, shopping lists, sayings)
filled from word lists with a fixed seed, so the file is public domain by construction and
anyone can regenerate it byte for byte::

    python -m rlscope.data.make_corpus            # rewrites src/rlscope/data/corpus.txt
    python -m rlscope.data.make_corpus --check    # exit 1 if the shipped file differs

Next-byte prediction on it has easy and hard cases on purpose: the rest of a word after its
first letters, fixed phrases ("said", "once upon a time"), counting and the order of weekdays
and months are nearly certain; the first letter of a content word (which of ~60 adjectives or
~90 nouns comes next) is close to a uniform guess. A few words carry non-ASCII letters
(café, naïve, façade) so the byte tokenizer meets multi-byte characters. Only `random.Random`
with a fixed seed and Python lists are used (no set or dict iteration over strings), so the
output does not depend on hash randomisation.
"""

from __future__ import annotations

import argparse
import random
import sys
import textwrap
from pathlib import Path

SEED = 20240601
TARGET_BYTES = 320_000
"""The generator stops at the first paragraph that brings the text past this size."""
WIDTH = 72
"""Lines are wrapped at this many characters, paragraphs separated by one blank line."""
PATH = Path(__file__).with_name("corpus.txt")

NAMES = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack",
         "Kate", "Leo", "Mary", "Noah", "Olive", "Peter", "Quinn", "Rose", "Sam", "Tom",
         "Ursula", "Victor", "Wendy", "Xavier", "Yara", "Zoe", "Martha", "Oscar", "Lucy",
         "Hugo", "Ada", "Walter"]
TITLES = ["the baker", "the farmer", "the miller", "the teacher", "the doctor", "the sailor",
          "the old woman", "the young man", "the shepherd", "the carpenter", "the captain",
          "the gardener", "the innkeeper", "the weaver", "the fisherman"]
# (singular, plural)
ANIMALS = [("dog", "dogs"), ("cat", "cats"), ("horse", "horses"), ("cow", "cows"),
           ("sheep", "sheep"), ("goose", "geese"), ("fox", "foxes"), ("mouse", "mice"),
           ("rabbit", "rabbits"), ("owl", "owls"), ("crow", "crows"), ("goat", "goats"),
           ("pig", "pigs"), ("duck", "ducks"), ("bear", "bears"), ("wolf", "wolves"),
           ("deer", "deer"), ("hen", "hens"), ("frog", "frogs"), ("donkey", "donkeys")]
THINGS = [("basket", "baskets"), ("lamp", "lamps"), ("letter", "letters"), ("coat", "coats"),
          ("box", "boxes"), ("knife", "knives"), ("cup", "cups"), ("book", "books"),
          ("key", "keys"), ("rope", "ropes"), ("bell", "bells"), ("candle", "candles"),
          ("hat", "hats"), ("boot", "boots"), ("map", "maps"), ("coin", "coins"),
          ("wheel", "wheels"), ("blanket", "blankets"), ("bucket", "buckets"),
          ("ladder", "ladders"), ("spoon", "spoons"), ("clock", "clocks"), ("mirror", "mirrors"),
          ("chair", "chairs"), ("table", "tables"), ("window", "windows"), ("door", "doors"),
          ("pencil", "pencils"), ("bottle", "bottles"), ("ribbon", "ribbons"),
          ("umbrella", "umbrellas"), ("kettle", "kettles"), ("needle", "needles"),
          ("hammer", "hammers"), ("shovel", "shovels"), ("façade", "façades")]
FOODS = [("apple", "apples"), ("pear", "pears"), ("loaf", "loaves"), ("egg", "eggs"),
         ("potato", "potatoes"), ("onion", "onions"), ("carrot", "carrots"),
         ("cherry", "cherries"), ("plum", "plums"), ("cake", "cakes"), ("pie", "pies"),
         ("turnip", "turnips"), ("lemon", "lemons"), ("berry", "berries"),
         ("cabbage", "cabbages"), ("peach", "peaches"), ("biscuit", "biscuits"),
         ("tomato", "tomatoes")]
PLACES = ["market", "mill", "river", "forest", "village", "harbour", "garden", "church",
          "bridge", "school", "meadow", "castle", "inn", "farm", "hill", "lake", "station",
          "library", "bakery", "orchard", "valley", "café", "lighthouse", "square"]
ADJECTIVES = ["old", "new", "small", "large", "red", "blue", "green", "yellow", "brown",
              "white", "black", "quiet", "noisy", "happy", "sad", "clever", "foolish", "brave",
              "tired", "hungry", "gentle", "proud", "shy", "curious", "heavy", "light", "warm",
              "cold", "wet", "dry", "clean", "dirty", "bright", "dark", "strange", "famous",
              "careful", "lazy", "busy", "golden", "silver", "wooden", "broken", "empty",
              "crooked", "tiny", "enormous", "round", "narrow", "wide", "sharp", "soft",
              "rough", "smooth", "sleepy", "honest", "naïve", "faithful", "patient", "merry"]
# (base, third person, past)
TRANSITIVE = [("find", "finds", "found"), ("carry", "carries", "carried"),
              ("paint", "paints", "painted"), ("mend", "mends", "mended"),
              ("sell", "sells", "sold"), ("buy", "buys", "bought"), ("lose", "loses", "lost"),
              ("hide", "hides", "hid"), ("wash", "washes", "washed"),
              ("open", "opens", "opened"), ("close", "closes", "closed"),
              ("build", "builds", "built"), ("drop", "drops", "dropped"),
              ("lift", "lifts", "lifted"), ("pull", "pulls", "pulled"),
              ("push", "pushes", "pushed"), ("fill", "fills", "filled"),
              ("count", "counts", "counted"), ("watch", "watches", "watched"),
              ("follow", "follows", "followed"), ("bring", "brings", "brought"),
              ("keep", "keeps", "kept"), ("give", "gives", "gave"), ("take", "takes", "took"),
              ("see", "sees", "saw"), ("hear", "hears", "heard"), ("catch", "catches", "caught"),
              ("throw", "throws", "threw"), ("polish", "polishes", "polished"),
              ("borrow", "borrows", "borrowed"), ("guard", "guards", "guarded"),
              ("admire", "admires", "admired"), ("remember", "remembers", "remembered"),
              ("forget", "forgets", "forgot"), ("draw", "draws", "drew"),
              ("weigh", "weighs", "weighed")]
INTRANSITIVE = [("sleep", "sleeps", "slept"), ("run", "runs", "ran"),
                ("sing", "sings", "sang"), ("laugh", "laughs", "laughed"),
                ("wait", "waits", "waited"), ("jump", "jumps", "jumped"),
                ("walk", "walks", "walked"), ("rest", "rests", "rested"),
                ("dance", "dances", "danced"), ("shiver", "shivers", "shivered"),
                ("whisper", "whispers", "whispered"), ("listen", "listens", "listened"),
                ("wander", "wanders", "wandered"), ("hurry", "hurries", "hurried"),
                ("smile", "smiles", "smiled"), ("cry", "cries", "cried"),
                ("swim", "swims", "swam"), ("climb", "climbs", "climbed"),
                ("work", "works", "worked"), ("play", "plays", "played")]
ADVERBS = ["slowly", "quickly", "quietly", "loudly", "happily", "sadly", "carefully",
           "gladly", "softly", "suddenly", "proudly", "patiently", "eagerly", "bravely",
           "gently", "early", "late", "again", "alone", "together"]
PREPOSITIONS = ["near", "behind", "beside", "under", "over", "across", "inside", "outside",
                "beyond", "past", "towards", "along"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve"]
WEATHER = ["it rained all day", "the sun was shining", "a cold wind blew from the north",
           "snow covered the fields", "fog lay over the river", "the sky was clear and blue",
           "thunder rolled over the hills", "a warm breeze came from the sea"]
TIMES = ["in the morning", "at noon", "in the evening", "at night", "before breakfast",
         "after supper", "at dawn", "at dusk", "on the way home", "once a week"]
FEELINGS = ["glad", "sorry", "afraid", "sure", "tired", "hungry", "ready", "late", "lost",
            "happy"]
SAYINGS = ["a stitch in time saves nine", "many hands make light work",
           "the early bird catches the worm", "look before you leap",
           "still waters run deep", "slow and steady wins the race",
           "every cloud has a silver lining", "where there is a will there is a way",
           "all that glitters is not gold", "better late than never"]
OPENINGS = ["Once upon a time", "Long ago", "One fine day", "Many years ago",
            "In those days"]


class Grammar:
    """Sentence makers over the word lists, all drawing from one seeded `random.Random`."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, words: list[str]) -> str:
        return self.rng.choice(words)

    def person(self) -> str:
        return self.pick(NAMES) if self.rng.random() < 0.7 else self.pick(TITLES)

    def noun(self, plural: bool = False) -> str:
        group = self.rng.choice([ANIMALS, THINGS, THINGS, FOODS])
        singular, many = self.rng.choice(group)
        return many if plural else singular

    def noun_phrase(self) -> str:
        det = self.pick(["the", "the", "a", "his", "her", "their"])
        adjective = self.pick(ADJECTIVES) + " " if self.rng.random() < 0.6 else ""
        phrase = f"{det} {adjective}{self.noun()}"
        if det == "a" and phrase[2] in "aeiou":
            phrase = "an" + phrase[1:]
        return phrase

    def place(self) -> str:
        return f"{self.pick(PREPOSITIONS)} the {self.pick(PLACES)}"

    def narration(self) -> str:
        verb = self.pick([v[2] for v in TRANSITIVE])
        parts = [self.person(), verb, self.noun_phrase()]
        if self.rng.random() < 0.6:
            parts.append(self.place())
        if self.rng.random() < 0.4:
            parts.append(self.pick(TIMES))
        return _sentence(" ".join(parts))

    def animal(self) -> str:
        adjective = self.pick(ADJECTIVES) + " " if self.rng.random() < 0.5 else ""
        verb = self.pick([v[2] for v in INTRANSITIVE])
        return _sentence(f"the {adjective}{self.rng.choice(ANIMALS)[0]} {verb} "
                         f"{self.pick(ADVERBS)} {self.place()}")

    def dialogue(self) -> str:
        who = self.person()
        kind = self.rng.randrange(4)
        if kind == 0:
            return (f'"I am {self.pick(FEELINGS)}," said {who}, "because I '
                    f'{self.pick([v[2] for v in TRANSITIVE])} {self.noun_phrase()}."')
        if kind == 1:
            return (f'{_cap(who)} asked, "Where is {self.noun_phrase()}?" '
                    f'"It is {self.place()}," said {self.person()}.')
        if kind == 2:
            return (f'"Please {self.pick([v[0] for v in TRANSITIVE])} {self.noun_phrase()}," '
                    f"said {who}.")
        greeting = self.pick(["morning", "evening", "night"])
        return f'"Good {greeting}," said {who} {self.pick(ADVERBS)}.'

    def counting(self) -> str:
        start = self.rng.randrange(0, 6)
        n = self.rng.randrange(3, 7)
        plural = self.noun(plural=True)
        listed = ", ".join(NUMBERS[start:start + n])
        return _sentence(f"{self.person()} counted the {plural}: {listed}")

    def calendar(self) -> str:
        if self.rng.random() < 0.5:
            i = self.rng.randrange(len(DAYS))
            return _sentence(f"after {DAYS[i]} comes {DAYS[(i + 1) % 7]}, and then "
                             f"{DAYS[(i + 2) % 7]}")
        i = self.rng.randrange(len(MONTHS))
        return _sentence(f"in {MONTHS[i]} {self.pick(WEATHER)}, and in {MONTHS[(i + 1) % 12]} "
                         f"{self.pick(WEATHER)}")

    def shopping(self) -> str:
        n = self.rng.randrange(2, 5)
        items = [f"{self.pick(NUMBERS[1:])} {self.rng.choice(FOODS)[1]}" for _ in range(n)]
        listed = ", ".join(items[:-1]) + " and " + items[-1]
        return _sentence(f"on {self.pick(DAYS)} {self.person()} went to the "
                         f"{self.pick(PLACES)} and bought {listed}")

    def rule(self) -> str:
        base = self.rng.choice(TRANSITIVE)
        result = self.rng.choice(INTRANSITIVE)
        return _sentence(f"if you {base[0]} the {self.noun()}, the "
                         f"{self.rng.choice(ANIMALS)[0]} {result[1]}")

    def saying(self) -> str:
        return _sentence(f"as the old saying goes, {self.pick(SAYINGS)}")

    def weather(self) -> str:
        return _sentence(f"on {self.pick(DAYS)} {self.pick(WEATHER)}, and the "
                         f"{self.noun(plural=True)} were {self.pick(ADJECTIVES)}")

    def paragraph(self) -> str:
        makers = [self.narration, self.narration, self.narration, self.animal, self.dialogue,
                  self.dialogue, self.counting, self.calendar, self.shopping, self.rule,
                  self.saying, self.weather]
        sentences = [self.rng.choice(makers)() for _ in range(self.rng.randrange(3, 8))]
        if self.rng.random() < 0.15:
            sentences.insert(0, f"{self.pick(OPENINGS)}, {self.narration()[0].lower()}"
                             f"{self.narration()[1:]}")
        return " ".join(sentences)


def _cap(text: str) -> str:
    return text[0].upper() + text[1:]


def _sentence(text: str) -> str:
    return _cap(text) + "."


def _roman(n: int) -> str:
    out = ""
    for value, symbol in ((10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")):
        while n >= value:
            out, n = out + symbol, n - value
    return out


def generate(seed: int = SEED, target_bytes: int = TARGET_BYTES) -> str:
    """The corpus: chapters ("CHAPTER IV.") of wrapped paragraphs, ending in a newline,
    just over ``target_bytes`` bytes of UTF-8."""
    grammar = Grammar(seed)
    blocks: list[str] = []
    size, chapter = 0, 0
    while size < target_bytes:
        if chapter == 0 or grammar.rng.random() < 0.04:
            chapter += 1
            blocks.append(f"CHAPTER {_roman(chapter)}.")
        blocks.append(textwrap.fill(grammar.paragraph(), WIDTH))
        size += len(blocks[-1].encode()) + 2
    return "\n\n".join(blocks) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the shipped corpus.txt instead of writing it")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        same = PATH.read_text(encoding="utf-8") == text
        sys.stderr.write(f"{PATH}: {'up to date' if same else 'differs from the generator'}\n")
        return 0 if same else 1
    PATH.write_text(text, encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
