"""kvconform's reference KV-event consumer (specs/FOREIGN_BACKEND.md,
"KV-event consumers"): it subscribes to vLLM's ZMQ KV events and keeps the
index a router keeps, with no hashing of its own: a stored block is found
from its parent's hash, its tokens, its LoRA adapter and its group.

--bug NAME turns it into a negative control that `kvconform consumer-check`
must catch: drop-parent (every stored run is indexed as a prompt start),
ignore-group (blocks of all groups in one index), array-only (decodes only
the array layout of releases up to 0.23; map-shaped events are skipped).
"""

import argparse
import json
import sys

import msgspec
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx")
REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Index:
    def __init__(self, bug):
        self.bug = bug
        self.children = {}  # (parent hash, tokens, lora, group) -> hash
        self.where = {}  # (hash, group) -> medium

    def group(self, g):
        return 0 if self.bug == "ignore-group" else (g or 0)

    def decode(self, raw):
        if isinstance(raw, dict):
            if self.bug == "array-only":
                return None  # an array decoder does not know maps: skipped
            return raw
        names = {"BlockStored": STORED_FIELDS, "BlockRemoved": REMOVED_FIELDS}.get(raw[0], ())
        return {"type": raw[0], **dict(zip(names, raw[1:]))}

    def apply(self, raw):
        ev = self.decode(raw)
        if ev is None:
            return
        kind = ev["type"]
        if kind == "AllBlocksCleared":
            self.children.clear()
            self.where.clear()
        elif kind == "BlockRemoved":
            for h in ev["block_hashes"]:
                self.where.pop((h, self.group(ev.get("group_idx"))), None)
        elif kind == "BlockStored":
            g = self.group(ev.get("group_idx"))
            parent = None if self.bug == "drop-parent" else ev.get("parent_block_hash")
            size = ev["block_size"]
            tokens = ev["token_ids"]
            for i, h in enumerate(ev["block_hashes"]):
                block = tuple(tokens[i * size:(i + 1) * size])
                self.children[(parent, block, ev.get("lora_name"), g)] = h
                self.where[(h, g)] = ev.get("medium")
                parent = h

    def cached(self, tokens, lora, group, size):
        parent, n, medium = None, 0, None
        g = self.group(group)
        for i in range(len(tokens) // size):
            h = self.children.get((parent, tuple(tokens[i * size:(i + 1) * size]), lora, g))
            if h is None or (h, g) not in self.where:
                break
            medium = self.where[(h, g)]
            parent, n = h, n + 1
        return n, medium


class Subscriber:
    def __init__(self, sub_endpoint, replay_endpoint, topic):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.connect(sub_endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay_endpoint = replay_endpoint
        self.next_seq = 0

    def replay(self, apply):
        """Everything from next_seq on, through the replay socket."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart((b"", self.next_seq.to_bytes(8, "big")))
        while True:
            if not dealer.poll(10_000):
                raise SystemExit("replay: no answer")
            _, _, seq, payload = dealer.recv_multipart()
            if seq == END_SEQ:
                break
            self.take(int.from_bytes(seq, "big"), payload, apply)
        dealer.close(linger=0)

    def take(self, seq, payload, apply):
        if seq < self.next_seq:
            return  # seen already
        for raw in msgspec.msgpack.decode(payload)[1]:
            apply(raw)
        self.next_seq = seq + 1

    def catch_up(self, last_seq, apply):
        while self.next_seq <= last_seq:
            if self.sub.poll(200):
                _, seq, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq, "big")
                if seq > self.next_seq:
                    self.replay(apply)  # a gap: fetch what was missed
                self.take(seq, payload, apply)
            else:
                self.replay(apply)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bug", choices=["drop-parent", "ignore-group", "array-only"])
    bug = p.parse_args().bug
    say({"kvconform_consumer": 1, "name": f"reference{'-' + bug if bug else ''}"})
    index, sub, size = Index(bug), None, 0
    for line in sys.stdin:
        m = json.loads(line)
        if m["type"] == "subscribe":
            sub = Subscriber(m["endpoint"], m["replay_endpoint"], m["topic"])
            size = m["block_size"]
            say({"ok": True})
        elif m["type"] == "query":
            sub.catch_up(m["last_seq"], index.apply)
            answers = []
            for q in m["queries"]:
                n, medium = index.cached(q["token_ids"], q["lora_name"], q["group_idx"], size)
                answers.append({"id": q["id"], "cached_blocks": n, "medium": medium})
            say({"step": m["step"], "answers": answers})
        elif m["type"] == "close":
            break


if __name__ == "__main__":
    main()
