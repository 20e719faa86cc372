"""Chat templates: render a conversation with the model's own jinja2 template, sandboxed as transformers does.

The template comes from the tokenizer (``Tokenizer.chat_template``: a GGUF's ``tokenizer.chat_template``, or an HF
directory's ``chat_template.jinja`` / ``tokenizer_config.json``). Templates are untrusted code from model files,
so they run in jinja2's ``ImmutableSandboxedEnvironment`` with transformers' settings and helpers
(``transformers/utils/chat_template_utils.py``): ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols``
extension, ``raise_exception``, a ``tojson`` that does not HTML-escape, ``strftime_now``, a restricted ``dict``
and ``namespace``, and ``{% generation %}`` blocks (rendered as their body). The special-token strings
(``bos_token``, ``eos_token``, ...) are template variables, so a prompt matches ``apply_chat_template``.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

MIN_JINJA2 = (3, 1, 6)  # older versions have known sandbox escapes (transformers refuses them too)


class ChatTemplateError(ValueError):
    """No template, a template that does not compile, or one that refuses the conversation (``raise_exception``)."""


def _jinja2():
    try:
        import jinja2  # noqa: PLC0415
        import jinja2.ext  # noqa: PLC0415
        import jinja2.sandbox  # noqa: PLC0415
    except ImportError as error:
        raise ImportError('chat templates need jinja2: pip install "specswap[serve]"') from error
    version = tuple(int(part) for part in jinja2.__version__.split(".")[:3] if part.isdigit())
    if version < MIN_JINJA2:
        raise ImportError(f"chat templates need jinja2 >= {'.'.join(map(str, MIN_JINJA2))} (sandbox fixes), "
                          f"found {jinja2.__version__}")
    return jinja2


@functools.lru_cache(maxsize=8)
def compile_chat_template(template: str):
    """The compiled template (cached: a server renders one template for every request)."""
    jinja2 = _jinja2()

    class Generation(jinja2.ext.Extension):
        # transformers marks assistant text with {% generation %}...{% endgeneration %} to build training masks;
        # for a prompt only the body matters
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        # only construction: no attribute access a template could climb through
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # no underscore attributes: they lead to CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set {name!r} on a namespace")

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    environment.filters["tojson"] = tojson
    environment.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                               namespace=TemplateNamespace)
    try:
        return environment.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ChatTemplateError(f"the model's chat template does not compile: {error} (line {error.lineno})") \
            from error


def render_chat(template: str, messages: list[dict[str, Any]], special_tokens: dict[str, str | None] | None = None,
                add_generation_prompt: bool = True, **variables: Any) -> str:
    """``template`` rendered over ``messages`` (``[{"role", "content"}, ...]``), the special-token strings and
    ``variables``, with ``add_generation_prompt`` (the assistant header the model continues from)."""
    jinja2 = _jinja2()
    compiled = compile_chat_template(template)
    context = {name: value for name, value in (special_tokens or {}).items() if value is not None}
    context.update(variables)
    try:
        return compiled.render(messages=messages, tools=None, documents=None,
                               add_generation_prompt=add_generation_prompt, **context)
    except jinja2.exceptions.TemplateError as error:  # raise_exception(...) and sandbox refusals
        raise ChatTemplateError(f"the model's chat template refused this conversation: {error}") from error


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[str, list[int]]:
    """The rendered prompt and its token ids, as ``apply_chat_template(..., add_generation_prompt=True)``
    tokenizes it: no BOS is added, because templates write ``bos_token`` themselves where the model wants it."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        raise ChatTemplateError(
            "this model has no chat template (none in the GGUF's tokenizer.chat_template, nor in the "
            "directory's chat_template.jinja or tokenizer_config.json chat_template); "
            "send a plain prompt to /v1/completions instead")
    text = render_chat(template, messages, getattr(tokenizer, "special_tokens", None))
    return text, tokenizer.encode(text, add_bos=False)


__all__ = ["ChatTemplateError", "chat_prompt_ids", "compile_chat_template", "render_chat"]
