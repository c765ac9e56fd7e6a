"""specnative's built-in prompt suite: a few chat prompts per task category, written for this
project in the spirit of Spec-Bench's categories (multi-turn chat, translation, summarization,
question answering, math reasoning, retrieval-style extraction) plus three code categories."""
from __future__ import annotations

from specnative.run.workloads.prompts import Prompt


# ---------------------------------------------------------------------------------------------
# The built-in suite (written for this project; deterministic)
# ---------------------------------------------------------------------------------------------
def _user(text: str) -> tuple:
    return (("user", text),)


_EXTRACTION_PASSAGE = (
    "Shipping update, 3 June: container MSKU 448120 left Rotterdam on 28 May aboard the Nordic "
    "Tern and is due in Gothenburg on 5 June. Container TGHU 902215, booked for the same sailing, "
    "was rolled to the Baltic Star, departing 6 June and arriving 9 June. The customs broker for "
    "both is Lindgren Freight (contact: Eva Lindgren, +46 31 555 0142). Invoice 2024-0613 for "
    "12,480 euros covers both containers; payment is due 30 days after delivery.")


_SUMMARY_PASSAGE = (
    "The city's bike-share scheme ended its third year with 1.9 million trips, up 23 percent on "
    "the year before. Electric bikes, introduced in March, made up a fifth of the fleet but a third "
    "of all trips, and their average trip was 4.1 km against 2.6 km on pedal bikes. Usage fell "
    "sharply in the two wettest months, and docking stations on the edge of the network were often "
    "empty during the morning peak because riders travelled into the centre and took the bus home. "
    "The operator plans to add 40 stations in the outer districts and to move bikes by van twice "
    "each morning. The council will review the scheme's subsidy, now 1.2 million a year, next spring.")


BUILTIN = {
    "chat": [
        (("user", "I'm planning a weekend trip to a city I've never visited. What should I pack?"),
         ("assistant", "It depends a little on the weather, but comfortable walking shoes, a light "
                       "rain jacket, a phone charger and a small day bag are always useful. "
                       "Where are you going?"),
         ("user", "Lisbon, in early November. Anything else I should bring or know?")),
        (("user", "My tomato plants have yellow leaves at the bottom. Should I worry?"),
         ("assistant", "Yellowing lower leaves are common and often harmless: older leaves age "
                       "first. It can also mean overwatering or a lack of nitrogen. How often do "
                       "you water them?"),
         ("user", "Every day, in pots on a sunny balcony. The soil always feels wet.")),
        (("user", "Can you help me write a short toast for my sister's wedding?"),
         ("assistant", "Of course. Tell me a little about your sister and her partner: how they "
                       "met, and a memory or quality you would like to mention."),
         ("user", "They met at a climbing gym, she is the most stubborn person I know, and he "
                  "is endlessly patient. Keep it under a minute.")),
        (("user", "I keep putting off a big report at work. Any advice?"),
         ("assistant", "Start by making the first step tiny: open the document and write the "
                       "headings. What part of the report feels hardest?"),
         ("user", "The introduction. I never know how to start it.")),
    ],
    "translation": [
        _user("Translate into French:\nThe museum is closed on Mondays, but the garden stays open "
              "until six in the evening."),
        _user("Translate into German:\nPlease send me the signed contract by Friday so that we can "
              "start the work next week."),
        _user("Translate into Spanish:\nThe train to the airport leaves every fifteen minutes from "
              "platform three."),
        _user("Translate into English:\nLe chat dort sur le canapé depuis ce matin et refuse de "
              "bouger, même pour manger."),
    ],
    "summarization": [
        _user("Summarize the following news item in two sentences.\n\n" + _SUMMARY_PASSAGE),
        _user("Summarize this e-mail in one sentence for a busy manager.\n\nHi all, the quarterly "
              "planning meeting moves from Thursday to Friday at 10:00 because the client visit was "
              "rescheduled. Please send your slides to Dana by Wednesday evening, keep them to five "
              "pages, and include the hiring numbers, which were missing last time. Lunch will be "
              "provided. Thanks, Omar"),
        _user("Give a three-bullet summary of this passage.\n\nCoral reefs cover less than one "
              "percent of the ocean floor but support about a quarter of all marine species. Warmer "
              "water makes corals expel the algae that live in their tissue and give them both "
              "colour and most of their food; this is called bleaching. Corals can recover if "
              "temperatures fall within a few weeks, but repeated heat waves leave too little time, "
              "and large areas of reef have died since 2016."),
        _user("Summarize the following review in one sentence.\n\nI bought this kettle because it "
              "was quiet, and it is: you can barely hear it. It boils a full litre in under three "
              "minutes. The lid is stiff, though, and after two months the limescale filter has "
              "started to come loose. Good value, but I would not pay full price again."),
    ],
    "qa": [
        _user("Why is the sky blue during the day but red at sunset? Answer in a short paragraph."),
        _user("What is the difference between a virus and a bacterium?"),
        _user("How does a bill become a law in a parliamentary system? Keep it brief."),
        _user("What causes the seasons on Earth?"),
    ],
    "math": [
        _user("A shop sells pencils at 3 for 75 cents. How much do 14 pencils cost? Show your "
              "reasoning step by step."),
        _user("A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average "
              "speed for the whole journey? Think step by step."),
        _user("Solve for x: 3(x - 4) + 2 = 2x + 5. Explain each step."),
        _user("A rectangle's length is 4 cm more than twice its width, and its perimeter is 38 cm. "
              "Find its area. Reason step by step."),
    ],
    "extraction": [
        _user("From the text below, list every container number with its ship, departure date and "
              "arrival date, as JSON.\n\n" + _EXTRACTION_PASSAGE),
        _user("From the text below, extract the invoice number, the amount, the payment terms and "
              "the contact person's phone number.\n\n" + _EXTRACTION_PASSAGE),
        _user("List all the people and organisations named in this text, one per line.\n\nAt the "
              "opening on Saturday, Mayor Helen Achebe thanked the Riverside Trust and the builders, "
              "Holt and Sons, and introduced the new director, Tomas Varga, who joins from the "
              "National Maritime Museum."),
        _user("Extract all dates and times from this message as a list.\n\nThe workshop runs on "
              "12 and 13 September from 09:30 to 16:00. Registration closes on 1 September at "
              "midnight, and the follow-up call is on 27 September at 15:00."),
    ],
    "code-completion": [
        _user("Complete this Python function. Reply with code only.\n\n```python\ndef is_palindrome("
              "text: str) -> bool:\n    \"\"\"True if text reads the same forwards and backwards, "
              "ignoring case and non-alphanumeric characters.\"\"\"\n```"),
        _user("Complete this Python function. Reply with code only.\n\n```python\ndef merge_sorted("
              "a: list[int], b: list[int]) -> list[int]:\n    \"\"\"Merge two sorted lists into one "
              "sorted list in linear time.\"\"\"\n    result = []\n    i = j = 0\n```"),
        _user("Complete this JavaScript function. Reply with code only.\n\n```javascript\n// Return "
              "the n-th Fibonacci number, computed iteratively.\nfunction fibonacci(n) {\n```"),
        _user("Complete this Python class. Reply with code only.\n\n```python\nclass Stack:\n    "
              "\"\"\"A last-in, first-out stack with push, pop, peek and __len__.\"\"\"\n\n    def "
              "__init__(self):\n        self._items = []\n```"),
    ],
    "code-editing": [
        _user("Add type hints and a docstring to this function. Reply with the full function.\n\n"
              "```python\ndef average(values):\n    total = 0\n    for v in values:\n        total += v\n"
              "    return total / len(values)\n```"),
        _user("This function should return the largest element but has a bug. Fix it and reply "
              "with the corrected code.\n\n```python\ndef largest(items):\n    best = 0\n    for item "
              "in items:\n        if item > best:\n            best = item\n    return best\n```"),
        _user("Rewrite this loop as a list comprehension.\n\n```python\nsquares = []\nfor n in "
              "range(20):\n    if n % 3 == 0:\n        squares.append(n * n)\n```"),
        _user("Rename the variables in this function to descriptive names and reply with the "
              "code.\n\n```python\ndef f(a, b):\n    c = {}\n    for d in a:\n        c[d] = c.get(d, 0) "
              "+ b\n    return c\n```"),
    ],
    "code-explanation": [
        _user("Explain what this code does, line by line.\n\n```python\nfrom collections import "
              "Counter\n\ndef top_words(text, n=3):\n    words = text.lower().split()\n    return "
              "Counter(words).most_common(n)\n```"),
        _user("What does this SQL query return?\n\n```sql\nSELECT customer_id, COUNT(*) AS orders\n"
              "FROM orders\nWHERE created_at >= '2024-01-01'\nGROUP BY customer_id\nHAVING COUNT(*) "
              "> 5\nORDER BY orders DESC;\n```"),
        _user("Explain the time complexity of this function.\n\n```python\ndef has_duplicates(xs):\n"
              "    seen = set()\n    for x in xs:\n        if x in seen:\n            return True\n"
              "        seen.add(x)\n    return False\n```"),
        _user("What does this shell command do?\n\n```sh\nfind . -name '*.log' -mtime +7 -print0 | "
              "xargs -0 gzip\n```"),
    ],
}


CATEGORIES = tuple(BUILTIN)


CODE_CATEGORIES = tuple(c for c in CATEGORIES if c.startswith("code-"))


def builtin_prompts() -> list[Prompt]:
    return [Prompt(category, messages, f"{category}/{i}")
            for category, suite in BUILTIN.items() for i, messages in enumerate(suite)]


# Plain openings without a chat template, for bench/ peers that send the same text to llama.cpp's
# tools and tests that need short prompts.
SEQUENCE_PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived",
    "The most important thing to know about the history of the city is",
    "Here is a short explanation of how a computer works:",
    "Dear friend, I am writing to tell you about the day when",
    "The three main reasons why people move to another country are",
    "In the morning the market was already full of people who",
    "A good teacher always remembers that every student",
    "The report of the committee says that the new government",
)
