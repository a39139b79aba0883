"""`eaglekit inspect`: what is this checkpoint, exactly (headers only; never imports torch)."""

from __future__ import annotations

import json

import click

from eaglekit.cli.output import (
    Styled,
    emit_json,
    format_option,
    given_paths,
    human_bytes,
    identifier_table,
    print_findings,
    print_fix,
    print_panel,
    print_table,
    print_text,
    target_path,
    with_given,
)

EXAMPLES = """
\b
Examples:
  eaglekit inspect ./my-draft
  eaglekit inspect ./my-draft --target ./Llama-3.1-8B-Instruct --format json
  eaglekit inspect org/some-eagle3-draft --subfolder compressed --tensors
"""


@click.command("inspect", epilog=EXAMPLES)
@click.argument("path")
@click.option("--target", callback=target_path,
              help="Target model dir, its config.json, or a Hub id (through the Hugging Face cache): fills in T "
                   "and the default aux ids.")
@click.option("--subfolder", help="Draft folder inside a repository that holds several drafts.")
@click.option("--revision", help="Hub revision when PATH is a repo id.")
@click.option("--family", help="Skip detection and read the checkpoint as this layout.")
@click.option("--tensors", "with_tensors", is_flag=True, help="List every tensor (canonical and source name).")
@click.option("--allow-pickle", is_flag=True, help="Load .bin/.pt weights with torch.load(weights_only=True).")
@format_option
def inspect_command(path, target, subfolder, revision, family, with_tensors, allow_pickle, output_format):
    """Show exactly what a draft checkpoint is: layout, geometry, aux ids, vocab map, flags, findings.

    A hidden-state store (`eaglekit capture`) is shown from its manifest and shard headers."""
    from eaglekit.capture import is_store
    from eaglekit.inspection import inspect_draft

    if is_store(path):
        from eaglekit.capture.store import describe_store

        doc = describe_store(path)
        emit_json(doc) if output_format == "json" else render_store(with_given(doc, given_paths([path])))
        return

    report = inspect_draft(path, subfolder=subfolder, revision=revision, target=target, allow_pickle=allow_pickle,
                           family=family, include_tensors=with_tensors)
    doc = report.to_dict()
    if output_format == "json":
        emit_json(doc)
        return
    doc = with_given(doc, given_paths([path], [target], resolved={doc["path"]: path}))
    if doc.get("eagle3_draft") is False:
        render_other_method(doc)
    else:
        render(doc)


def _ids(doc: dict) -> Styled:
    ids, written, conv = doc["aux_layer_ids"], doc["aux_layer_ids_as_written"], doc["aux_layer_id_convention"]
    vllm = "unknown" if ids is None else str(ids)
    text = f"{vllm} (vLLM: input of layer i)"
    if written is not None and conv == "output":
        text += f"; written {written} (output of layer i)"
    elif written is not None and ids is None:
        text += f"; written {written} (convention unknown)"
    certainty = "" if doc["aux_layer_id_convention_known"] else " (guessed)"
    return Styled(text, (certainty, "yellow"), "\n", (doc["aux_layer_ids_source"], "dim"))


def _parallel_rows(parallel: dict | None) -> list[tuple[str, str]]:
    """A P-EAGLE draft: how it drafts, and its flags as vLLM reads them beside those written above."""
    if parallel is None:
        return []
    mask = parallel["mask_hidden_shape"]
    vllm = parallel["vllm"]
    drafting = (f"{parallel['method']}: parallel drafting (one forward proposes all k tokens), mask token "
                f"{parallel['mask_token_id']}, mask_hidden {mask if mask is not None else 'missing'}; vLLM needs "
                f"{', '.join(vllm['settings'])}")
    read = ", ".join(f"{k}={vllm[k]}" for k in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual"))
    if vllm["not_carried"]:
        read += f" ({' and '.join(vllm['not_carried'])} written but dropped)"
    return [("drafting", drafting), (f"flags in vLLM {vllm['version']}", read)]


def render(doc: dict) -> None:
    flags = ", ".join(f"{k}={doc[k]}" for k in ("fc_norm", "norm_output", "norm_before_fc", "norm_before_residual"))
    geometry = (f"H={doc['hidden_size']}  T={doc['target_hidden_size']}  I={doc['intermediate_size']}  "
                f"layers={doc['num_layers']}")
    if doc["mla"]:
        m = doc["mla"]
        heads = (f"heads={doc['num_attention_heads']}  q_lora={m['q_lora_rank']}  kv_lora={m['kv_lora_rank']}  "
                 f"nope={m['qk_nope_head_dim']}  rope={m['qk_rope_head_dim']}  v={m['v_head_dim']}")
    else:
        heads = f"heads={doc['num_attention_heads']}  kv_heads={doc['num_key_value_heads']}  head_dim={doc['head_dim']}"
    vocab = (f"V={doc['vocab_size']}  Vd={doc['draft_vocab_size']}  d2t={'yes' if doc['has_d2t'] else 'no'}  "
             f"t2d={'yes' if doc['has_t2d'] else 'no'}")
    shared = []
    if not doc["has_embed_tokens"]:
        shared.append("embed_tokens from target")
    if not doc["has_lm_head"]:
        shared.append("lm_head from target")
    rows = [
        ("family", f"{doc['family']} — {doc['producer']}"),
        ("EAGLE version", doc["eagle_version"]),
        ("architecture", f"{', '.join(doc['architectures']) or '—'} (model_type {doc['model_type']}, "
                         f"{doc['config_layout']} config)"),
        ("attention", doc["attention"]),
        ("geometry", geometry),
        ("heads", heads),
        ("K (aux states)", doc["num_aux_hidden_states"]),
        ("aux layer ids", _ids(doc)),
        ("vocabulary", vocab),
        ("embed / head", ", ".join(shared) or "both stored in the draft"),
        ("flags", flags),
        *_parallel_rows(doc["parallel_drafting"]),
        ("dtype / size", f"{doc['dtype']}, {doc['num_parameters']:,} params, {human_bytes(doc['total_bytes'])} in "
                         f"{len(doc['files'])} file(s)"),
    ]
    print_panel(rows, doc["path"])
    print_table("Serving these files", ("engine", "min version", "serves them", "why / what to pass"),
                [_serving_row(s) for s in doc["serving"]])
    for s in doc["serving"]:
        if s["verdict"] == "after conversion" and s["fix"]:
            print_fix(f"{s['engine']}: ", s["fix"])

    if doc["findings"]:
        print_findings(doc["findings"])
    else:
        print_text(Styled(("No findings.", "green")))
    if "tensors" in doc:
        tensor_rows = [[t["name"], "" if t["source_name"] == t["name"] else t["source_name"], t["dtype"],
                        str(t["shape"]), t["file"]] for t in doc["tensors"]]
        identifier_table("Tensors", ["name", "source name", "dtype", "shape", "file"], tensor_rows)


def _serving_row(s: dict) -> tuple[str, str, str | Styled, str]:
    """An engine's row of the serving table: its floor, its verdict, and why or what to pass."""
    verdict = Styled(("no", "red")) if s["verdict"] == "not as is" else s["verdict"]
    converts = "the command below converts" if s["fix"] else "convert with `upgrade --to gguf --target TARGET.gguf`"
    why = "; ".join(s["settings"]) if s["verdict"] == "with settings" else (
        f"loads GGUF: {converts}" if s["verdict"] == "after conversion" else s.get("reason") or "")
    return s["engine"], s.get("min_version") or "—", verdict, why


def render_other_method(doc: dict) -> None:
    """A draft of another speculative method: the one line that names it and its vLLM method, then what its
    config says."""
    m, vllm = doc["speculative_method"], doc["speculative_method"]["vllm"]
    layers = m["target_layer_ids"]
    rows = [
        ("family", f"{m['family']} — {m['producer']} ({m['form']} form)"),
        ("vLLM", f"method '{vllm['method']}' (since {vllm['since']}; read at {vllm['version']}): "
                 f"--speculative-config '{_serve_config(doc)}'"),
        ("architecture", f"{', '.join(m['architectures']) or '—'} (model_type {m['model_type']})"),
        ("block size", "—" if m["block_size"] is None else m["block_size"]),
        ("layers", "—" if m["num_layers"] is None else m["num_layers"]),
        ("target layer ids", "—" if layers is None else
         f"{layers} ({m['target_layer_ids_key']}); vLLM captures hidden_states {m['target_layer_ids_captured']}"),
        ("target layers (L)", "—" if m["num_target_layers"] is None else m["num_target_layers"]),
        ("mask token id", "—" if m["mask_token_id"] is None else m["mask_token_id"]),
        ("method config", ", ".join(f"{k}={v}" for k, v in m["method_config"].items()) or "—"),
        ("tensors", m["num_tensors"]),
    ]
    print_text(Styled((m["summary"], "bold")), wrap=False)
    print_panel(rows, doc["path"])
    if vllm["problem"]:
        print_text(Styled(("vLLM: ", "bold yellow"), vllm["problem"]), wrap=False)
    for note in m["notes"]:
        print_text(Styled(("note: ", "dim"), note), wrap=False)
    print_text("eaglekit validates, upgrades and verifies EAGLE-3 drafts only; none of its commands reads this one.")


def _serve_config(doc: dict) -> str:
    """The speculative config to pass, with K left to choose; MTP inside a target needs no draft model."""
    m = doc["speculative_method"]
    model = {} if m["form"] == "target checkpoint" else {"model": doc["path"]}
    text = json.dumps({**model, **m["vllm"]["speculative_config"]})
    return text[:-1] + ', "num_speculative_tokens": K}'


def render_store(doc: dict) -> None:
    target, ids, engine, store = doc["target"], doc["layer_ids"], doc["engine"], doc["store"]
    progress = "complete" if doc["complete"] else "incomplete: rerun the capture to finish it"
    rows = [
        ("kind", f"hidden-state store, format {doc['format']} v{doc['version']} ({progress})"),
        ("records", f"{doc['records']} of {doc['planned_records']} planned, {doc['tokens']:,} of "
                    f"{doc['planned_tokens'] or 0:,} tokens"),
        ("target", f"{target['model_type']}, L={target['num_hidden_layers']}, H={target['hidden_size']}, "
                   f"V={target['vocab_size']}; config {target['config_sha256'][:19]}…"),
        ("layer ids", f"aux {ids['aux']} + id L={ids['last']} ({ids['convention']} convention)"),
        ("engine", f"{engine['name']} ({engine['version'] or 'version unknown'}), dtype {engine['dtype']}, "
                   f"numerics {engine['quantization'] or 'full precision'}, TP {engine['tensor_parallel_size']}"),
        ("data", doc["inputs"].get("source", "")),
        ("storage", f"{store['dtype']}, {len(doc['shards'])} shard(s) of ~{store['shard_tokens']:,} tokens, "
                    f"{human_bytes(doc['bytes'])}" + (f" ({doc['bytes_per_token']:,} B/token)"
                                                      if doc["bytes_per_token"] else "")),
        ("tensors", ", ".join(f"{n} {t['dtype']}{t['shape']}" for n, t in doc["tensors"].items()) or "—"),
    ]
    print_panel(rows, doc["path"])
    for problem in doc["problems"]:
        print_text(Styled(("problem: ", "red"), problem))
