"""Magpie prompts by kind of request: a system prompt per kind steers what the base model asks itself.

Magpie (Xu et al. 2024) lets an instruction-tuned model write its own user turns from the chat template's
user header alone. Left alone, a small model asks the same few things again and again; a system prompt naming
a kind of request (MT-Bench's eight categories, described in our own words: never a benchmark question)
spreads the prompts over what chat users ask. The steering prompt is marked `steer`: the model reads it
while it writes the user turn, and the answer is written without it, in the context the decoder sees at
serving time (the template's own default system prompt), so the draft learns the answers users will get.
"""

from collections.abc import Iterator

KINDS: dict[str, str] = {
    "writing": "Users ask you for help with writing: stories, poems, letters, emails, speeches, essays, blog "
               "posts, product descriptions and slogans.",
    "roleplay": "Users ask you to play a character or take part in an imagined situation: a famous person, a job, "
                "a game, a story that you tell together.",
    "reasoning": "Users give you puzzles, riddles and questions that need careful step-by-step thinking and logic.",
    "math": "Users ask you to solve math problems: arithmetic, algebra, geometry, probability and word problems, "
            "step by step.",
    "coding": "Users ask you to write, explain, review or fix code: Python, JavaScript, C++, SQL, shell scripts, "
              "algorithms and data structures.",
    "extraction": "Users give you a text (an article, a table, a review, a list) and ask you to pull out facts, "
                  "names, numbers or a summary in a given format such as JSON or a list.",
    "stem": "Users ask questions about science, technology, engineering and medicine: physics, chemistry, biology, "
            "computers, machines and the human body.",
    "humanities": "Users ask about history, philosophy, economics, law, literature, art, culture and society.",
}


def magpie_kind_rows(kind: str) -> Iterator[tuple[str, dict]]:
    """Endless rows of one kind: the steering system prompt, a user turn for the model to write, its answer."""
    if kind not in KINDS:
        raise ValueError(f"unknown Magpie kind {kind!r}: use one of {', '.join(KINDS)}")
    steer = {"role": "system", "content": f"You are a helpful AI assistant. {KINDS[kind]}", "steer": True}
    i = 0
    while True:
        yield f"magpie-{kind}-{i}", {"id": f"magpie-{kind}-{i:07d}",
                                     "messages": [steer, {"role": "user", "write": True},
                                                  {"role": "assistant", "content": ""}]}
        i += 1
