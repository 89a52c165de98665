"""Chapter 04's hash-chain explorer: two prompts, hashed by the engine's own block hasher, drawn as
chains that share their first blocks and diverge at the first block whose content differs."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets

from nanocourse.live import show_view
from nanoengine.core import get_request_block_hasher
from nanoengine.request import Request


@dataclass(slots=True, frozen=True)
class ChainLink:
    index: int
    hash_hex: str
    text: str
    shared: bool  # the other prompt has the same hash at the same index


def block_chain(token_ids: list[int], block_size: int, cache_salt: str | None = None) -> list[bytes]:
    """The engine's block hashes for a prompt: exactly what the prefix cache would look up."""
    hasher = get_request_block_hasher(block_size)
    return Request("explorer", token_ids, block_hasher=hasher, cache_salt=cache_salt).block_hashes


def compare_chains(
    tokenizer, text_a: str, text_b: str, block_size: int = 16, salt_a: str | None = None, salt_b: str | None = None
) -> tuple[list[ChainLink], list[ChainLink]]:
    """Both prompts' chains, each link marked shared or not. Only full blocks get a hash."""
    ids_a, ids_b = tokenizer.encode(text_a), tokenizer.encode(text_b)
    chain_a, chain_b = block_chain(ids_a, block_size, salt_a), block_chain(ids_b, block_size, salt_b)

    def links(ids, chain, other):
        return [
            ChainLink(
                i,
                h.hex()[:8],
                tokenizer.decode(ids[i * block_size : (i + 1) * block_size]),
                i < len(other) and other[i] == h,
            )
            for i, h in enumerate(chain)
        ]

    return links(ids_a, chain_a, chain_b), links(ids_b, chain_b, chain_a)


def _row_html(label: str, links: list[ChainLink]) -> str:
    cells = "".join(
        f'<td title="{_escape(link.text)}" style="background:{"#9be39b" if link.shared else "#f5b7a8"};'
        f'padding:4px 6px;font-family:monospace;border:1px solid #666">{link.hash_hex}</td>'
        for link in links
    )
    return f"<tr><th style='padding-right:8px'>{label}</th>{cells or '<td>(no full block yet)</td>'}</tr>"


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")


class HashChainExplorer:
    """Type two prompts; see which of their blocks a prefix cache could share.

    Green links have the same hash in both chains (a cache hit for the second prompt), red ones
    differ. Hover a link to see its 16 tokens. Once a link is red, every later one is too: each
    hash covers its parent.
    """

    def __init__(self, tokenizer, text_a: str, text_b: str, block_size: int = 16):
        self.tokenizer, self.block_size = tokenizer, block_size
        layout = {"width": "95%"}
        # Tall enough to show each prompt whole (a Textarea shows two lines by default).
        rows = max(4, *(t.count("\n") + 2 for t in (text_a, text_b)))
        self.text_a = widgets.Textarea(value=text_a, description="Prompt A", rows=rows, layout=layout)
        self.text_b = widgets.Textarea(value=text_b, description="Prompt B", rows=rows, layout=layout)
        self.salt_b = widgets.Text(value="", description="B's salt", placeholder="cache_salt for B (optional)")
        self.view = widgets.HTML()
        self.summary = widgets.HTML()
        for w in (self.text_a, self.text_b, self.salt_b):
            w.observe(lambda _: self.refresh(), names="value")
        self.widget = widgets.VBox([self.text_a, self.text_b, self.salt_b, self.view, self.summary])
        self.refresh()

    def refresh(self) -> None:
        self.links_a, self.links_b = compare_chains(
            self.tokenizer, self.text_a.value, self.text_b.value, self.block_size, None, self.salt_b.value or None
        )
        self.view.value = f"<table>{_row_html('A', self.links_a)}{_row_html('B', self.links_b)}</table>"
        shared = sum(link.shared for link in self.links_b)
        # The engine never lets a hit cover a prompt's last token (its logits are needed).
        usable = min(shared, (len(self.tokenizer.encode(self.text_b.value)) - 1) // self.block_size)
        self.cached_tokens = max(usable, 0) * self.block_size
        self.summary.value = (
            f"B shares {shared} of its {len(self.links_b)} full blocks with A; after A has run, the prefix "
            f"cache would spare B {self.cached_tokens} tokens of prefill."
        )

    def _ipython_display_(self) -> None:
        show_view(self)
