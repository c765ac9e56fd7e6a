"""What the sequences of a cell read: prompts by task category and the long-context documents.

Acceptance depends on the task (a draft guesses code and copied facts far better than open
chat), so the sweep measures per category. The built-in suite was written for specnative, in
the spirit of Spec-Bench's categories (multi-turn chat, translation, summarization, question
answering, math reasoning, retrieval-style extraction) plus three code categories for code
models. Every prompt is a chat (role, content) list; the target model's chat template is applied
with llama.cpp (llama_chat_apply_template) where the model has one, plain "Role: text" lines
where it has none.

A cell's `task` is a category (every sequence gets a prompt of it, cycled) or `mixed` (the
sequences take the categories in turn). A `ctx_len` > 0 puts exactly ctx_len tokens of shared
context ahead of every sequence's own prompt: a system message (where the template has one)
holding real, varied documents (workload_documents/, or a user's --context file), cut to length;
the documents are identified by sha256 in provenance.

User prompt files (`--prompts FILE`): JSON lines {"text": ...} or {"messages": [{"role", "content"},
...]} with an optional "category", or plain text, one prompt per line. A text is one user message.

Public sets (`--dataset mt-bench|humaneval|sharegpt[:N]`, public_sets.py; dataset_prompts here):
each item is used once per concurrency, in batches of N different items of one category (and one
MT-Bench turn): a cell per batch, the last batch filled up by cycling from the category's first
item (batches_of). HumanEval prompts are continued as is (no template); an MT-Bench turn-2 prompt
holds turn 1, the target's own greedy turn-1 answer (answer_tokens long, generated once per model
by answer_with's engine) and turn 2; a ShareGPT prompt carries its request's output length.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MIXED = "mixed"
ALL = "all"
DOCUMENTS_DIR = Path(__file__).with_name("workload_documents")
CONTEXT_HEADER = "Reference documents for the conversation below:\n\n"
ROLES = ("system", "user", "assistant")
# Below this many document tokens a "long context" is not one.
MIN_DOCUMENT_TOKENS = 16
# Stands for the model's own answer in a turn-2 prompt until answer_with's engine has written it
MODEL_ANSWER = "[[specnative: the model's own answer to the previous turn]]"
# Re-tokenizing an answer inside the template may take a few more tokens than were generated
ANSWER_SLACK = 16


class PromptFileError(ValueError):
    """A bad prompt file; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    category: str
    messages: tuple       # ((role, content), ...)
    ident: str            # "category/index" (built-in), "file:line" or a public set's item id
    # Public sets (public_sets.py) only:
    dataset: str | None = None       # the set's name: its prompts are batched item by item
    completion: bool = False         # continue messages[0]'s text as is (HumanEval): no template
    turn: int | None = None          # MT-Bench: 1 or 2
    answer_of: "Prompt | None" = None  # turn 2: the turn whose model answer fills MODEL_ANSWER
    output_len: int | None = None    # ShareGPT: the request's output length (recorded, capped)


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


# ---------------------------------------------------------------------------------------------
# User prompt files
# ---------------------------------------------------------------------------------------------
def _messages_of(entry: dict, where: str) -> tuple:
    if "messages" in entry:
        messages = entry["messages"]
        if not isinstance(messages, list) or not messages:
            raise PromptFileError(f"{where}: \"messages\" must be a non-empty list")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptFileError(f"{where}: message {i} needs a string \"role\" and \"content\"")
            if m["role"] not in ROLES:
                raise PromptFileError(f"{where}: message {i} has role {m['role']!r}; expected one of {', '.join(ROLES)}")
            out.append((m["role"], m["content"]))
        if out[-1][0] == "assistant":
            raise PromptFileError(f"{where}: the last message must not be the assistant's (the model answers it)")
        return tuple(out)
    text = entry.get("text")
    if not isinstance(text, str) or not text.strip():
        raise PromptFileError(f"{where}: needs a non-empty \"text\" string or a \"messages\" list")
    return (("user", text),)


def parse_prompt_lines(lines: list[str], name: str) -> list[Prompt]:
    """Prompts of a file's lines (JSONL when its first non-empty line starts with '{', plain text
    otherwise); blank lines are skipped. A bad line raises PromptFileError naming it."""
    content = [(n, line.rstrip("\r\n")) for n, line in enumerate(lines, start=1) if line.strip()]
    if not content:
        raise PromptFileError(f"{name}: no prompts (the file is empty)")
    jsonl = content[0][1].lstrip().startswith("{")
    prompts = []
    for n, line in content:
        where = f"{name}:{n}"
        if not jsonl:
            prompts.append(Prompt("user", (("user", line),), where))
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptFileError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None
        except RecursionError:
            raise PromptFileError(f"{where}: JSON nested too deeply to be a prompt") from None
        if not isinstance(entry, dict):
            raise PromptFileError(f"{where}: expected a JSON object with \"text\" or \"messages\"")
        unknown = set(entry) - {"text", "messages", "category"}
        if unknown:
            raise PromptFileError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                                  f"expected text, messages, category")
        category = entry.get("category", "user")
        if not isinstance(category, str) or not category.strip() or category in (MIXED, ALL) or "," in category:
            raise PromptFileError(f"{where}: \"category\" must be a non-empty string without commas, "
                                  f"not {MIXED!r} or {ALL!r}")
        prompts.append(Prompt(category.strip(), _messages_of(entry, where), where))
    return prompts


def load_prompt_file(path) -> list[Prompt]:
    path = Path(path)
    try:
        # utf-8-sig: a byte-order mark (spreadsheets and Windows editors write one) is not text
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: prompt file not found") from None
    except IsADirectoryError:
        raise PromptFileError(f"{path}: is a directory, not a prompt file") from None
    except UnicodeDecodeError as error:
        raise PromptFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
    except OSError as error:
        raise PromptFileError(f"{path}: cannot read it ({error.strerror})") from None
    return parse_prompt_lines(file_lines(text), str(path))


def file_lines(text: str) -> list[str]:
    """A text file's lines: split at line ends only (\\n, \\r\\n, \\r), not at the other breaks
    str.splitlines knows (U+2028, U+0085, form feed, ...), which are characters of a prompt."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def prompts_sha256(prompts: list[Prompt]) -> str:
    """Identity of a prompt set by content (categories and messages, in order): what a resume
    compares, so that a file edited at the same path is not taken for the same prompts."""
    return _sha(json.dumps([[p.category, p.messages] for p in prompts], ensure_ascii=False))


def categories_of(prompts: list[Prompt]) -> list[str]:
    return list(dict.fromkeys(p.category for p in prompts))


def resolve_tasks(requested: list[str], prompts: list[Prompt]) -> list[str]:
    """`all` -> every category present; `mixed` and category names kept; unknown -> ValueError."""
    known = categories_of(prompts)
    tasks = []
    for task in requested:
        for name in (known if task == ALL else [task]):
            if name != MIXED and name not in known:
                raise ValueError(f"unknown task {name!r}; known: {', '.join(known + [MIXED, ALL])}")
            if name not in tasks:
                tasks.append(name)
    return tasks


def batches_of(prompts: list[Prompt] | None, task: str, concurrency: int) -> list[list[Prompt]]:
    """The sequences' prompts of every cell of (task, concurrency). Built-in and user prompts: one
    cell (prompts_for). A public set: each item once, in batches of `concurrency` items of the task
    (and of one turn), the last batch filled up by cycling from the start of its turn."""
    prompts = builtin_prompts() if prompts is None else prompts
    if not any(p.dataset for p in prompts):
        return [prompts_for(prompts, task, concurrency)]
    chosen = [p for p in prompts if task in (MIXED, p.category)]
    batches = []
    for turn in dict.fromkeys(p.turn for p in chosen):
        group = [p for p in chosen if p.turn == turn]
        batches += [[group[(start + i) % len(group)] for i in range(concurrency)]
                    for start in range(0, len(group), concurrency)]
    return batches


def dataset_prompts(items, dataset: str) -> list[Prompt]:
    """Prompts of public_sets items: turn 1 of every item, then turn 2 (MT-Bench), each turn 2
    asked after turn 1 and the model's own answer to it."""
    firsts = [Prompt(item.category, (("user", item.turns[0]),), item.ident + ("/turn1" if len(item.turns) > 1 else ""),
                     dataset=dataset, completion=item.completion, turn=1 if len(item.turns) > 1 else None,
                     output_len=item.output_len) for item in items]
    seconds = [Prompt(item.category, (("user", item.turns[0]), ("assistant", MODEL_ANSWER), ("user", item.turns[1])),
                      f"{item.ident}/turn2", dataset=dataset, turn=2, answer_of=first)
               for item, first in zip(items, firsts) if len(item.turns) > 1]
    return firsts + seconds


def load_dataset(spec: str, model_path, n_predict: int = 32, **fetch) -> tuple[list[Prompt], dict]:
    """A public set ('mt-bench', 'humaneval:16', 'sharegpt:16', ...) as prompts, and its provenance
    record (public_sets.load). The model's tokenizer measures ShareGPT's requests (output lengths
    capped at n_predict; what does not fit is skipped and counted)."""
    from specnative import _core, public_sets

    vocab = _core.VocabModel(str(model_path))
    selection = public_sets.load(spec, count_tokens=lambda text: len(vocab.tokenize(text, False, False)),
                                 output_cap=n_predict, **fetch)
    record = {**selection.record, "tokenizer": Path(model_path).name}  # whose tokens ShareGPT's lengths count
    return dataset_prompts(selection.items, selection.source.name), record


def dataset_workload(spec: str, model_path, n_predict: int = 32, **fetch) -> "Workload":
    """The Python equivalent of the sweep's --dataset: a Workload of a public set for one model
    (turn-2 prompts need answer_with(engine) before they are tokenized)."""
    prompts, record = load_dataset(spec, model_path, n_predict, **fetch)
    return Workload(model_path, prompts, source=f"dataset {spec}", answer_tokens=n_predict, dataset=record)


def n_predict_for(chosen: list[Prompt], default: int) -> int:
    """Tokens a cell generates: the longest of its requests' output lengths where they carry one
    (ShareGPT; the engine takes one length per call, so at concurrency > 1 the shorter requests
    run on to it), else the sweep's n_predict."""
    lengths = [p.output_len for p in chosen if p.output_len is not None]
    return max(lengths) if lengths else default


def prompts_for(prompts: list[Prompt], task: str, concurrency: int) -> list[Prompt]:
    """One prompt per sequence: a category's prompts cycled, or for `mixed` the categories in
    turn (sequence i: category i mod n, its (i div n)-th prompt)."""
    by_category = {c: [p for p in prompts if p.category == c] for c in categories_of(prompts)}
    if task != MIXED:
        chosen = by_category[task]
        return [chosen[i % len(chosen)] for i in range(concurrency)]
    names = list(by_category)
    return [by_category[names[i % len(names)]][(i // len(names)) % len(by_category[names[i % len(names)]])]
            for i in range(concurrency)]


# ---------------------------------------------------------------------------------------------
# Long-context documents
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Documents:
    text: str
    sources: tuple  # ({"name", "sha256", "chars"}, ...)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def builtin_documents() -> Documents:
    parts, sources = [], []
    for path in sorted(DOCUMENTS_DIR.glob("*.txt")):
        body = path.read_text(encoding="utf-8").strip()
        parts.append(body)
        sources.append({"name": path.name, "sha256": _sha(body), "chars": len(body)})
    return Documents("\n\n---\n\n".join(parts), tuple(sources))


def documents_from_file(path) -> Documents:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig").strip()
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: the context file is not UTF-8 text (byte {error.start}): a binary file?") from None
    except OSError as error:
        raise ValueError(f"{path}: cannot read the context file ({error.strerror})") from None
    if not text:
        raise ValueError(f"{path}: the context file is empty")
    if "\x00" in text:
        raise ValueError(f"{path}: the context file holds NUL bytes (a binary file, not text)")
    return Documents(text, ({"name": path.name, "sha256": _sha(text), "chars": len(text)},))


# ---------------------------------------------------------------------------------------------
# Rendering and tokenizing for one model
# ---------------------------------------------------------------------------------------------
def plain_chat(messages) -> str:
    """The rendering for a model without a chat template."""
    return "\n\n".join(f"{role.capitalize()}: {content}" for role, content in messages) + "\n\nAssistant:"


class Workload:
    """Prompts and documents, tokenized for one model file (its own tokenizer and template,
    read by llama.cpp without loading the weights)."""

    MARK = "[[specnative: documents here]]"  # no NUL: the template API takes C strings

    def __init__(self, model_path, prompts: list[Prompt] | None = None, documents: Documents | None = None,
                 source: str = "built-in", answer_tokens: int = 32, dataset: dict | None = None):
        from specnative import _core

        self._core = _core
        self.answer_tokens, self.dataset = answer_tokens, dataset
        self.answers: dict[str, str] = {}  # turn-1 ident -> the model's own answer (turn 2's context)
        self._answer = None
        self.prompts = list(prompts if prompts is not None else builtin_prompts())
        if not self.prompts:
            raise ValueError("no prompts")
        self.documents = documents or builtin_documents()
        self.source = source
        self.vocab = _core.VocabModel(str(model_path))
        self.template = self.vocab.chat_template
        self.template_used = "none (plain 'Role: text' lines)"
        if self.template:
            try:
                _core.chat_apply_template(self.template, [("user", "x")], True)
                self.template_used = "the model's chat template (llama_chat_apply_template)"
            except ValueError:
                self.template = ""
                self.template_used = "none: llama.cpp does not support the model's template; plain lines"
        self._document_tokens = None
        self.max_document_cycles = 0
        self._cells = {}

    # -- the model's own answers (MT-Bench turn 2) -----------------------------------------------
    def answer_with(self, engine) -> None:
        """Turn-1 answers come from `engine`'s target: greedy, answer_tokens long (or to its end of
        generation), once per prompt; turn 2 is asked after them."""
        self._answer = lambda tokens: engine.generate([tokens], n_predict=self.answer_tokens, temperature=0.0).texts[0]

    def answer(self, prompt: Prompt) -> str:
        if prompt.ident not in self.answers:
            if self._answer is None:
                raise ValueError(f"the turn after {prompt.ident} needs the model's own answer to it: "
                                 f"call answer_with(engine) first")
            self.answers[prompt.ident] = self._answer(self.tokenize(self.text_of(prompt), True))
        return self.answers[prompt.ident]

    def messages_of(self, prompt: Prompt, answer: str | None = None) -> tuple:
        """The prompt's chat, the model's own answer written in (or `answer`, for sizing)."""
        if prompt.answer_of is None:
            return prompt.messages
        answer = self.answer(prompt.answer_of) if answer is None else answer
        return tuple((role, answer if content == MODEL_ANSWER else content) for role, content in prompt.messages)

    def text_of(self, prompt: Prompt, answer: str | None = None) -> str:
        if prompt.completion:
            return prompt.messages[0][1]
        return self.render(self.messages_of(prompt, answer))

    # -- text ------------------------------------------------------------------------------------
    def render(self, messages) -> str:
        messages = [tuple(m) for m in messages]
        if self.template:
            return self._core.chat_apply_template(self.template, messages, True)
        return plain_chat(messages)

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        return list(self.vocab.tokenize(text, add_special, True))  # parse the template's markers

    def document_tokens(self, n: int) -> list[int]:
        """The first n tokens of the documents (cycled, with the count kept, if they are shorter)."""
        if self._document_tokens is None:
            self._document_tokens = list(self.vocab.tokenize(self.documents.text, False, False))
        piece = self._document_tokens
        cycles = -(-n // len(piece))
        self.max_document_cycles = max(self.max_document_cycles, cycles)
        return (piece * cycles)[:n]

    # -- token prompts ---------------------------------------------------------------------------
    def split(self, prompt: Prompt) -> tuple[list[int], list[int]]:
        """(head, tail) tokens around the documents: head = BOS and the context message's opening
        (the same for every prompt), tail = the rest of the rendered chat."""
        if prompt.completion:  # no chat: the documents as plain text ahead of the text to continue
            text = CONTEXT_HEADER + self.MARK + "\n\n" + prompt.messages[0][1]
        else:
            text = self.render((("system", CONTEXT_HEADER + self.MARK),) + self.messages_of(prompt))
        if self.MARK not in text:
            raise ValueError(f"the chat template dropped the context message of {prompt.ident}")
        head, tail = text.split(self.MARK, 1)
        return self.tokenize(head, True), self.tokenize(tail, False)

    def token_prompts(self, task: str, concurrency: int, ctx_len: int,
                      batch: int = 0) -> tuple[list[list[int]], list[Prompt]]:
        """One token prompt per sequence: ctx_len tokens of shared context (0: none) then the
        sequence's own prompt (of the task's `batch`-th cell, batches_of)."""
        chosen = batches_of(self.prompts, task, concurrency)[batch]
        if ctx_len == 0:
            return [self.tokenize(self.text_of(p), True) for p in chosen], chosen
        split = [self.split(p) for p in chosen]
        head = split[0][0]
        if any(h != head for h, _ in split):
            raise ValueError("the chat template renders the context message differently per prompt; "
                             "cannot share the documents between sequences")
        problem = self.ctx_len_problem(ctx_len)
        if problem:
            raise ValueError(problem)
        shared = head + self.document_tokens(ctx_len - len(head))
        return [shared + tail for _, tail in split], chosen

    def cell_prompts(self, task: str, concurrency: int, ctx_len: int,
                     batch: int = 0) -> tuple[list[list[int]], list[Prompt]]:
        """token_prompts, computed once per cell shape (the sweep asks for them more than once)."""
        key = (task, concurrency, ctx_len, batch)
        if key not in self._cells:
            self._cells[key] = self.token_prompts(task, concurrency, ctx_len, batch)
        return self._cells[key]

    def ctx_len_problem(self, ctx_len: int) -> str | None:
        """Why ctx_len cannot hold the context header and some documents, or None."""
        if ctx_len == 0:
            return None
        head = len(self.split(self.prompts[0])[0])
        if ctx_len - head < MIN_DOCUMENT_TOKENS:
            return (f"ctx_len {ctx_len} leaves {ctx_len - head} document tokens after the {head}-token "
                    f"context header; use 0 or at least {head + MIN_DOCUMENT_TOKENS}")
        return None

    def max_own_tokens(self, tasks: list[str], concurrency: int) -> int:
        """The longest sequence's own part (after the shared context) over these tasks: sizes
        the KV cache before any model is loaded."""
        longest = 0
        for task in tasks:
            for p in {p: None for batch in batches_of(self.prompts, task, concurrency) for p in batch}:
                if p.answer_of is not None:  # before any answer exists: its room, as an upper bound
                    longest = max(longest, len(self.tokenize(self.text_of(p, answer=""), True))
                                  + self.answer_tokens + ANSWER_SLACK)
                    continue
                longest = max(longest, len(self.tokenize(self.text_of(p), True)), len(self.split(p)[1]))
        return longest

    def dataset_columns(self, chosen: list[Prompt]) -> dict:
        """traces.csv's public-set columns for a cell's prompts (none for the built-in suite)."""
        if self.dataset is None or not any(p.dataset for p in chosen):
            return {}
        lengths = [p.output_len for p in chosen]
        return {"dataset": f"{self.dataset['name']} ({self.dataset['package']}=={self.dataset['version']})",
                "dataset_sha256": self.dataset["sha256"], "turn": chosen[0].turn,
                "output_lens": ";".join(map(str, lengths)) if None not in lengths else None}

    def record(self) -> dict:
        """Provenance: which prompts, which documents (by sha256), which template."""
        public = {}
        if self.dataset is not None:
            public = {"dataset": self.dataset, "turn1_answers": {
                "rule": f"the target's greedy answer to turn 1 alone, at most {self.answer_tokens} tokens, is turn 2's "
                        f"context (a cell per turn)", "count": len(self.answers),
                "sha256": _sha(json.dumps(sorted(self.answers.items()), ensure_ascii=False))},
                "batching": "each item once per concurrency N: batches of N items of one category and turn, "
                            "the last batch filled up by cycling from the first item of its turn; a cell per batch"}
        return {"source": self.source, **public, "prompts": len(self.prompts),
                "categories": {c: sum(p.category == c for p in self.prompts) for c in categories_of(self.prompts)},
                "prompts_sha256": prompts_sha256(self.prompts), "chat_template": self.template_used,
                "chat_template_sha256": _sha(self.template) if self.template else None,
                "context_sha256": self.documents.sha256, "context_documents": list(self.documents.sources),
                "context_tokens": len(self._document_tokens) if self._document_tokens is not None else None,
                "context_max_cycles": self.max_document_cycles,
                "context_note": "ctx_len tokens of these documents (in order, cut to length; cycled "
                                "only where context_max_cycles > 1) precede every sequence's prompt"}


def token_prompts_sha256(token_prompts: list[list[int]]) -> str:
    """Identity of exactly what a cell fed the models."""
    return _sha(json.dumps(token_prompts))
