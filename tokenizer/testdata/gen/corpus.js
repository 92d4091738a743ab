// Writes tokenizer/testdata/corpus.jsonl: the strings the parity fixtures
// encode, one JSON string a line. Deterministic: a fixed seed drives a
// small PRNG, so re-running it reproduces the file byte for byte.
//
//   node tokenizer/testdata/gen/corpus.js
"use strict";
const fs = require("fs");
const path = require("path");

let seed = 0x6b76726f; // "kvro"
function rand() { // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (n) => Math.floor(rand() * n);

const english = ("the quick brown fox jumps over lazy dog router cache token block prefix " +
  "replica request model serving latency throughput memory attention decode prefill batch " +
  "Hello world Kubernetes GPU vLLM isn't don't we'll they're I'm you've she'd IT'S WE'LL " +
  "naïve café résumé coöperate façade Zürich São Paulo").split(" ");
const code = [
  "func main() {\n\tfmt.Println(\"hi\")\n}\n",
  "def f(x):\n    return x**2  # square\n",
  "for (let i = 0; i < n; i++) { sum += a[i]; }",
  "if err != nil {\n\t\treturn nil, fmt.Errorf(\"load: %w\", err)\n\t}",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
  "<div class=\"box\"><span>&nbsp;x&lt;y</span></div>",
  "const re = /^[a-z0-9_-]{3,16}$/i;",
  "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);}",
  "```python\nimport numpy as np\nnp.zeros((3, 4))\n```",
  "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
  "x := map[string][]int{\"a\": {1, 2}}\r\n",
  "    indented    code\t\twith\ttabs   ",
  "fn parse<'a>(s: &'a str) -> Result<Vec<&'a str>, Error> { todo!() }",
  "$ curl -sS https://example.com/api/v1/items?limit=10&offset=20 | jq '.[]'",
];
const cjk = ["你好，世界！", "这是一个测试句子。", "東京は日本の首都です。", "ひらがなとカタカナ", "カタカナ語",
  "안녕하세요 세계", "한국어 문장입니다.", "漢字かな交じり文", "中文English混合", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３"];
const scripts = ["مرحبا بالعالم", "السلام عليكم ورحمة الله", "नमस्ते दुनिया", "हिन्दी में वाक्य है।",
  "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่าง", "Привет, мир!", "Γειά σου Κόσμε", "שלום עולם",
  "Xin chào thế giới", "Tiếng Việt có dấu", "ሰላም ዓለም", "Բարեւ աշխարհ", "გამარჯობა", "ওহে বিশ্ব", "வணக்கம்"];
const emoji = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🏳️‍🌈", "❤️", "🤖", "🚀🚀🚀", "🧑🏿‍💻", "✨", "𝕳𝖊𝖑𝖑𝖔", "𐍈", "🀄"];
const zw = ["\u200b", "\u200c", "\u200d", "\ufeff", "\u2060", "\u00ad"];
const spaces = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ",
  "\u00a0", "\u3000", "\u2009", "\u2003", "\u202f", "\u0085", "\v", "\f", "\r"];
const specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
  "<|start_header_id|>", "<|end_header_id|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>",
  "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|start|>", "<|message|>", "<|end|>",
  "<|channel|>", "<s>", "</s>", "[INST]", "<unk>", "<think>", "</think>", "<tool_call>",
  "<|im_start", "im_end|>", "<start_of_image>", "<|fim_prefix|>", "<pad>"];
const numbers = () => pick([
  String(int(10)), String(int(1000)), String(int(1e9)) + String(int(1e9)), "3.14159265358979",
  "-0.000123", "1,234,567.89", "+1 (555) 010-" + String(1000 + int(9000)), "2024-06-01T12:34:56Z",
  "0x" + int(1e9).toString(16), "1e-9", "١٢٣٤٥", "१२३", "½ ¾ ²³", "Ⅻ", "１２３４５"]);
const urls = () => pick(["https://github.com/huggingface/tokenizers/blob/main/README.md",
  "http://localhost:8080/v1/chat/completions", "user.name+tag@example.co.uk",
  "/usr/local/lib/python3.12/site-packages/", "C:\\Program Files\\App\\app.exe",
  "ftp://ftp.example.org/pub/file-" + int(100) + ".tar.gz", "www.例え.jp/パス?q=テスト"]);
// NFD forms: a letter followed by a combining mark, so NFC normalizers change them.
const nfd = () => pick(["e\u0301", "a\u0308", "n\u0303", "o\u0302", "A\u030a", "c\u0327", "u\u0308\u0301",
  "\u1100\u1161\u11a8", "e\u0301te\u0301", "Cafe\u0301 na\u0308ive", "Z\u0336a\u0337l\u0338g\u0335o\u0334"]);
const combining = () => "a" + "\u0300\u0301\u0302\u0303\u0304\u0305\u0306\u0307\u0308".slice(0, 1 + int(9));
const contractions = () => pick(["it's", "IT'S", "we'RE", "they'Ve", "I'm", "you'LL", "he'd",
  "'s", "''", "don't", "o'clock", "rock 'n' roll", "’s curly"]);

const atoms = [
  () => pick(english), () => pick(english), () => pick(english), () => pick(code), () => pick(cjk),
  () => pick(scripts), () => pick(emoji), () => pick(zw), () => pick(spaces), () => pick(spaces),
  () => pick(specials), numbers, urls, nfd, combining, contractions,
  () => pick("!@#$%^&*()_+-=[]{};:'\",.<>/?\\|`~…—–«»¿¡"),
  () => pick(["a", "Z", "_", ".", "-", "=", " ", "\n", "0", "é", "日", "😀"]).repeat(1 + int(40)),
];

function sentence() {
  const n = 1 + int(24);
  let s = "";
  for (let i = 0; i < n; i++) {
    s += pick(atoms)();
    if (rand() < 0.6) s += " ";
  }
  return s;
}

const fixed = [
  "", " ", "  ", "\n", "\t", "\r\n", "Hello, world!", "Hello world", " Hello", "Hello ", "hello  world",
  "   leading spaces", "trailing spaces   ", "a\n\n\nb", "a \n b", "tab\tseparated\tvalues",
  "line one\r\nline two\r\n", "   \n\t  \r\n  ", "<|im_start|>", "<|im_start|><|im_end|>",
  "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
  "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
  "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>", "<|start|>user<|message|>Hi<|end|>",
  "<s>[INST] Hello [/INST]", "a<|im_start|>b", " <|im_start|> ", "<|im_start|>  x", "x  <|im_end|>",
  "12345678901234567890", "3.14", "1,000,000", "2024", "Ａ", "ﬁ ligature", "Å Å", "é é",
  "e\u0301", "\u00e9", "한국어", "\u1112\u1161\u11ab", "😀😀😀", "👨‍👩‍👧‍👦", "a\u200bb", "\ufeffBOM",
  "ΣΑΣ σας", "İstanbul", "ß ẞ", "x".repeat(300), " ".repeat(100), "\n".repeat(50), "ab".repeat(200),
  "▁already▁meta", "<0x41>", "[multimodal]", "<unused0>", "<unused99>x", "\u0000nul", "\u001bescape",
];

const out = fixed.slice();
while (out.length < 1200) out.push(sentence());
const dst = path.join(__dirname, "..", "corpus.jsonl");
fs.writeFileSync(dst, out.map((s) => JSON.stringify(s)).join("\n") + "\n");
console.log(`wrote ${out.length} strings to ${dst}`);
