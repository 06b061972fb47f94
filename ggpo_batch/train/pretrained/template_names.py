"""The names a Jinja chat template reads from its render context: parsed from its syntax tree, never
guessed by rendering.

`read_names` is what Jinja itself reports (`jinja2.meta.find_undeclared_variables`): every name the
template may look up in its context, which includes a name it assigns in one branch only and reads
after (`{% if x %}{% set content = ... %}{% endif %}{{ content }}`, Mistral's `loop_messages`,
Gemma-3's `first_user_prefix`). `free_names` is the part a caller can mean to pass: the names the
template reads and never assigns anywhere, plus those it assigns only as the default of a name it
tests with `is defined` (Llama-3's `date_string`, `tools_in_user_message`).

Imports jinja2 only when called (transformers needs it for chat templates anyway).
"""

from __future__ import annotations

from typing import Any, ClassVar


def parse(source: str) -> Any:
    """The syntax tree of `source`, compiled as transformers compiles chat templates
    (chat_template_utils._compile_jinja_template: trim_blocks, lstrip_blocks, loop controls and its
    `{% generation %}` block)."""
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """transformers' `{% generation %}...{% endgeneration %}` block (its assistant-mask marker),
        parsed as its body."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    return env.parse(source)


def read_names(source: str) -> frozenset[str]:
    """Every name `source` may look up in its render context (Jinja's own analysis)."""
    from jinja2 import meta

    return frozenset(meta.find_undeclared_variables(parse(source)))


def free_names(source: str) -> frozenset[str]:
    """The names `source` takes from its caller: read and never assigned by the template, or tested
    with `is defined` (a keyword with a default the template fills in)."""
    from jinja2 import meta, nodes

    tree = parse(source)
    read = meta.find_undeclared_variables(tree)
    assigned = {n.name for n in tree.find_all(nodes.Name) if n.ctx in ("store", "param")}
    tested = {t.node.name for t in tree.find_all(nodes.Test)
              if t.name == "defined" and isinstance(t.node, nodes.Name)}
    return frozenset((read - assigned) | (read & tested))
