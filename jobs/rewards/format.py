"""A format reward with partial credit, for jobs/math-cpu.toml: a user's reward file as TRL calls one,
score(prompts, completions, **columns) -> one float per completion.

1.0 for a final answer written as \\boxed{integer}, 0.5 for a \\boxed{...} holding anything else, 0.25
for a completion with a digit in it, else 0: a signal a tiny policy can climb before it can do sums.
"""

import re

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def score(prompts, completions, **columns):
    out = []
    for text in completions:
        boxed = _BOXED.findall(text)
        if boxed and re.fullmatch(r"\s*-?\d+\s*", boxed[-1]):
            out.append(1.0)
        elif boxed:
            out.append(0.5)
        elif any(ch.isdigit() for ch in text):
            out.append(0.25)
        else:
            out.append(0.0)
    return out
