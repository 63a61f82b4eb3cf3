"""``specd generate``: stream one completion, optionally colouring accepted draft tokens."""

from __future__ import annotations

import argparse
import itertools
import sys

from specd.cli.common import add_model_options, resolve_models

GREEN, RESET = "\033[32m", "\033[0m"


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate a completion, streaming it",
                       description="Generate a completion of PROMPT with speculative decoding, streaming it.")
    p.add_argument("prompt", help="the prompt text")
    add_model_options(p)
    p.add_argument("--method", default="draft", choices=["draft", "ngram", "suffix", "none"],
                   help="speculation method (default: draft model)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="draft tokens per step (default 4)")
    p.add_argument("--draft-tree-width", type=int, default=1,
                   help="with --method draft: 1 = draft chains (default); w in 2..8 = draft token trees of "
                        "width w (EAGLE-2 style)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-tokens", type=int, default=0, help="no EOS or stop token before this many tokens")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 0; 1 = off (default)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2]; 0 = off (default)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2]; 0 = off (default)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--show-accepted", action="store_true",
                   help="colour the tokens that were accepted drafts (green)")
    p.add_argument("--logprobs", type=int, default=None, metavar="N",
                   help="after the text, print every generated token's log-probability under the target "
                        "(raw log-softmax), its rank and the N most likely tokens (N in 0..20)")
    so = p.add_argument_group("structured outputs (one of them; needs specd[structured])")
    so.add_argument("--json-schema", default=None, metavar="SCHEMA",
                    help="the output is JSON following this schema (JSON text, or @FILE)")
    so.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    so.add_argument("--regex", default=None, help="the output matches this regular expression")
    so.add_argument("--choice", action="append", default=None, metavar="TEXT",
                    help="the output is one of these strings (repeat the option)")
    so.add_argument("--grammar", default=None, help="the output follows this EBNF grammar (xgrammar's syntax)")
    so.add_argument("--jump-forward-tokens", type=int, default=8, metavar="N",
                    help="verify the text the grammar forces as drafts, up to N tokens, in steps without other "
                         "drafts (jump-forward decoding; also with --method none; 0 = off; default 8)")
    p.set_defaults(run=run)


def _structured(args: argparse.Namespace):
    """The StructuredOutputsParams the options ask for (None: no constraint)."""
    import specd

    schema = args.json_schema
    if schema is not None and schema.startswith("@"):
        with open(schema[1:], encoding="utf-8") as f:
            schema = f.read()
    given = {"json": schema, "json_object": args.json_object or None, "regex": args.regex, "choice": args.choice,
             "grammar": args.grammar}
    given = {k: v for k, v in given.items() if v is not None}
    return specd.StructuredOutputsParams(**given) if given else None


def run(args: argparse.Namespace) -> int:
    import specd

    try:
        params = specd.SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                      min_p=args.min_p, max_tokens=args.max_tokens, seed=args.seed,
                                      logprobs=args.logprobs, min_tokens=args.min_tokens,
                                      repetition_penalty=args.repetition_penalty,
                                      presence_penalty=args.presence_penalty,
                                      frequency_penalty=args.frequency_penalty, structured_outputs=_structured(args))
        spec = specd.SpeculationConfig(method=args.method, num_speculative_tokens=args.num_speculative_tokens,
                                       draft_tree_width=args.draft_tree_width,
                                       jump_forward_tokens=args.jump_forward_tokens)
    except (specd.InvalidArgumentError, OSError) as e:
        print(f"specd generate: error: {e}", file=sys.stderr)
        return 2
    target, draft = resolve_models(args, want_draft=args.method == "draft")
    if args.method == "draft" and draft is None:
        print("specd generate: error: --method draft needs --draft", file=sys.stderr)
        return 2
    llm = specd.LLM(target, draft, spec, dtype=args.dtype, device=args.device, max_num_seqs=1)
    prompt = args.prompt
    if args.chat and getattr(llm.tokenizer, "chat_template", None):
        prompt = llm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                   add_generation_prompt=True)
    out, metrics, error, tokens, logprobs = sys.stdout, None, None, [], []
    try:
        chunks = llm.stream(prompt, params)
        first = next(chunks, None)  # the request is made (and its constraint compiled) here
    except specd.InvalidArgumentError as e:
        print(f"specd generate: error: {e}", file=sys.stderr)
        return 2
    for chunk in itertools.chain([] if first is None else [first], chunks):
        for piece, accepted in zip(chunk.pieces, chunk.accepted):
            out.write(f"{GREEN}{piece}{RESET}" if args.show_accepted and accepted and piece else piece)
        out.flush()
        metrics = chunk.metrics or metrics
        error = chunk.error
        tokens += chunk.token_ids
        logprobs += chunk.logprobs or []
    out.write("\n")
    if args.logprobs is not None:
        _print_logprobs(tokens, logprobs, args.logprobs)
    if error is not None:
        print(f"specd generate: error: {error}", file=sys.stderr)
        return 1
    print(f"[specd] {metrics.generated_tokens} tokens, {metrics.tokens_per_s:.2f} tokens/s, "
          f"{metrics.verify_steps} verify steps, acceptance rate {metrics.acceptance_rate:.2f}, "
          f"mean accepted length {metrics.mean_accepted_length:.2f} tokens/step", file=sys.stderr)
    return 0


def _print_logprobs(tokens: list[int], logprobs: list, top: int) -> None:
    """One line per generated token on stderr: position, token, logprob, rank, the top ones."""
    print("[specd] logprobs (target, raw log-softmax): position, token, logprob, rank, most likely",
          file=sys.stderr)
    for j, (token, entry) in enumerate(zip(tokens, logprobs)):
        chosen = entry[token]
        best = sorted(entry.items(), key=lambda kv: (kv[1].rank, kv[0]))[:top]
        alts = ", ".join(f"{lp.decoded_token!r} {lp.logprob:.3f}" for _, lp in best)
        print(f"  {j:4d} {chosen.decoded_token!r:>12} {chosen.logprob:9.4f} {chosen.rank:6d}  {alts}",
              file=sys.stderr)
