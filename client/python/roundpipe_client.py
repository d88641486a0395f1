#!/usr/bin/env python3
"""Example Python client for roundpiped.

The gRPC stubs are generated from proto/ with Debian's protoc and grpc_python_plugin (the build
puts them in <build>/client/python; add that directory to PYTHONPATH). Needs python3-grpcio.

  roundpipe_client.py --address 127.0.0.1:50151 info
  roundpipe_client.py --address ... run spec.json [--text FILE ...]   # submit, stream, watch
  <venv>/bin/python roundpipe_client.py prepare --model-dir DIR --input chat.jsonl --out data.safetensors
  <venv>/bin/python roundpipe_client.py chat-prompts --model-dir DIR --input chats.jsonl --out sampling.json

`run` submits the JSON job spec, streams the bytes of the --text files as byte-level tokens when
the job takes streamed data, then watches the job until it ends. Exit status: 0 when the job
SUCCEEDED, 1 when it failed or was cancelled, 3 when the daemon refused a request.

`prepare` needs no daemon: it renders {"messages": [...]} chat records with the model's own chat
template (transformers, in the venv that deploy/install-deps.sh makes) into a token dataset file
with an assistant-only loss mask (roundpipe_prepare.py says how). `chat-prompts` renders
conversations with the same template into prompts for sample generations (eval.samples, or
`roundpipe generate --sampling_file`; roundpipe_chat.py says how).
"""
import argparse
import os
import sys

try:  # the RPC commands; `prepare` runs without them (in the venv, which has no grpc)
    import grpc
    from google.protobuf import json_format

    from roundpipe.v1 import admin_pb2, admin_pb2_grpc, jobs_pb2, jobs_pb2_grpc
except ImportError as _e:
    grpc = None
    _grpc_error = _e


def metadata(token):
    return [("authorization", "Bearer " + token)] if token else []


def batches(job, tokens, batch, seq):
    per = batch * seq
    for i in range(0, len(tokens) - per + 1, per):
        b = jobs_pb2.Batch(batch=batch, sequence=seq, tokens=tokens[i:i + per])
        if i == 0:
            b.job_id = job
        yield b


def run(args, channel):
    jobs = jobs_pb2_grpc.JobServiceStub(channel)
    with open(args.spec) as f:
        spec = json_format.Parse(f.read(), jobs_pb2.JobSpec())
    job = jobs.SubmitJob(jobs_pb2.SubmitJobRequest(spec=spec), metadata=metadata(args.token))
    print(job.id, flush=True)
    if args.text:
        tokens = []
        for path in args.text:
            with open(path, "rb") as f:
                tokens.extend(f.read())
        b = spec.batching
        summary = jobs.StreamBatches(batches(job.id, tokens, b.global_batch, b.sequence_length),
                                     metadata=metadata(args.token))
        print(f"streamed {summary.accepted} batches", flush=True)
    final = None
    for event in jobs.WatchJob(jobs_pb2.WatchJobRequest(job_id=job.id), metadata=metadata(args.token)):
        kind = event.WhichOneof("event")
        if kind == "step":
            s = event.step
            print(f"step {s.step} loss {s.loss:.4f} tokens/s {s.tokens_per_second:.0f}", flush=True)
        elif kind == "state":
            final = jobs_pb2.JobState.Name(event.state)
            print(f"state {final} {event.message}".rstrip(), flush=True)
        elif kind == "eval":
            e = event.eval
            best = "best so far" if e.is_best else f"best {e.best_loss:.4f} at step {e.best_step}"
            print(f"eval at step {e.step} loss {e.loss:.4f} over {e.tokens} tokens ({best})", flush=True)
        elif kind == "checkpoint_failed":
            print(event.checkpoint_failed, flush=True)
        elif kind == "progress":
            print(event.progress, flush=True)
    return 0 if final == "JOB_STATE_SUCCEEDED" else 1


def info(args, channel):
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    reply = admin.GetServerInfo(admin_pb2.GetServerInfoRequest(), metadata=metadata(args.token))
    print(json_format.MessageToJson(reply))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", default=os.environ.get("ROUNDPIPE_ADDRESS", "127.0.0.1:50151"))
    p.add_argument("--token", default=os.environ.get("ROUNDPIPE_TOKEN"))
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="submit a job spec, stream text, watch until the job ends")
    r.add_argument("spec")
    r.add_argument("--text", nargs="*", default=[])
    sub.add_parser("info", help="devices, memory and versions of the daemon")
    pr = sub.add_parser("prepare", help="render chat JSONL with the model's chat template into a token dataset file")
    pr.add_argument("--model-dir", required=True, help="holds tokenizer.json and tokenizer_config.json")
    pr.add_argument("--input", required=True, help='JSONL of {"messages": [{"role", "content"}, ...]}')
    pr.add_argument("--out", required=True, help="the .safetensors token dataset to write")
    ch = sub.add_parser("chat-prompts", help="render chat JSONL with the model's chat template into sample prompts")
    ch.add_argument("--model-dir", required=True, help="holds tokenizer.json and tokenizer_config.json")
    ch.add_argument("--input", required=True, help='JSONL of {"messages": [{"role", "content"}, ...]}')
    ch.add_argument("--out", help="the SamplePolicy JSON to write (default: stdout)")
    args = p.parse_args()
    if args.command in ("prepare", "chat-prompts"):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        if args.command == "chat-prompts":
            import roundpipe_chat
            return roundpipe_chat.main(args)
        import roundpipe_prepare
        return roundpipe_prepare.main(args)
    if grpc is None:
        print(f"roundpipe_client: {args.command} needs python3-grpcio and the generated stubs: {_grpc_error}",
              file=sys.stderr)
        return 3
    with grpc.insecure_channel(args.address) as channel:
        try:
            return run(args, channel) if args.command == "run" else info(args, channel)
        except grpc.RpcError as e:
            print(f"roundpipe_client: {e.code().name}: {e.details()}", file=sys.stderr)
            return 3


if __name__ == "__main__":
    sys.exit(main())
