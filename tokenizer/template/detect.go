package template

import (
	"strings"
)

// vLLM decides, per template, whether message content reaches the template
// as one string (text parts joined with "\n") or as the OpenAI list of
// parts (renderers/hf.py, _detect_content_format). Its rule reads the
// template's AST: the names bound to `messages` (the variable itself and
// every `{% set x = <messages…> %}`, transitively), then the loop variables
// of `{% for m in <one of those> %}`, and the format is "openai" exactly
// when some `{% for c in m.content %}` / `m['content']` loop exists. Here
// "<x…>" is x itself, possibly sliced (x[1:]), filtered (x|reverse) or
// tested. The Go engine keeps its AST private, so this file re-parses just
// the `for` and `set` statements, enough to apply the same rule; any
// expression it does not model counts as "something else", as it does for
// vLLM.

// expr is the part of a Jinja expression the rule looks at.
type expr struct {
	kind exprKind
	name string // exprName: the variable; exprAttr: the key or attribute
	node *expr  // the wrapped expression of attr, slice, filter and test
}

type exprKind int

const (
	exprOther  exprKind = iota
	exprName            // a variable read
	exprAttr            // x.key or x['key']
	exprSlice           // x[a:b]
	exprFilter          // x | f
	exprTest            // x is t
)

// isVarOrElems reports whether e reads varname (or varname's key, when key
// is set), through any slices, filters and tests, as vLLM's
// _is_var_or_elems_access does.
func isVarOrElems(e *expr, varname, key string) bool {
	for e != nil && (e.kind == exprFilter || e.kind == exprTest || e.kind == exprSlice) {
		e = e.node
	}
	if e == nil {
		return false
	}
	if key == "" {
		return e.kind == exprName && e.name == varname
	}
	return e.kind == exprAttr && e.name == key && e.node != nil &&
		e.node.kind == exprName && e.node.name == varname
}

// statement is a `for` or `set` statement reduced to target and value.
type statement struct {
	loop bool
	// target is the bound name; simple is false for tuple or namespace
	// targets, which vLLM's rule asserts against (and then falls back to
	// "string").
	target string
	simple bool
	value  *expr
}

// detectOpenAIFormat applies vLLM's content-format rule to a template.
func detectOpenAIFormat(src string) bool {
	stmts := statements(src)
	// Names bound to messages, breadth first, as vLLM walks them.
	names := []string{"messages"}
	seen := map[string]bool{"messages": true}
	for i := 0; i < len(names); i++ {
		for _, s := range stmts {
			if s.loop || !isVarOrElems(s.value, names[i], "") {
				continue
			}
			if !s.simple {
				return false
			}
			if !seen[s.target] {
				seen[s.target] = true
				names = append(names, s.target)
			}
		}
	}
	var messageVars []string
	for _, s := range stmts {
		if !s.loop {
			continue
		}
		for _, n := range names {
			if isVarOrElems(s.value, n, "") {
				if !s.simple {
					return false
				}
				messageVars = append(messageVars, s.target)
				break
			}
		}
	}
	for _, s := range stmts {
		if !s.loop {
			continue
		}
		for _, n := range messageVars {
			if isVarOrElems(s.value, n, "content") {
				return s.simple
			}
		}
	}
	return false
}

// statements returns the template's `for` and `set x = …` statements in
// source order, skipping comments and raw blocks.
func statements(src string) []statement {
	var out []statement
	for i := 0; i < len(src); {
		j := strings.IndexByte(src[i:], '{')
		if j < 0 || i+j+1 >= len(src) {
			break
		}
		i += j
		switch src[i+1] {
		case '#':
			end := strings.Index(src[i+2:], "#}")
			if end < 0 {
				return out
			}
			i += 2 + end + 2
		case '{':
			i = skipTag(src, i+2, "}}")
		case '%':
			end := skipTag(src, i+2, "%}")
			body := src[i+2 : max(i+2, end-2)]
			i = end
			toks := lex(strings.Trim(body, "-+ \t\r\n"))
			if len(toks) > 0 && toks[0] == "raw" {
				k := strings.Index(src[i:], "endraw")
				if k < 0 {
					return out
				}
				i = skipTag(src, i+k, "%}")
				continue
			}
			if s, ok := parseStatement(toks); ok {
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out
}

// skipTag returns the index just past the closing delimiter, stepping over
// string literals so that a "%}" inside quotes does not end the tag.
func skipTag(src string, i int, closing string) int {
	for i < len(src) {
		switch c := src[i]; {
		case c == '\'' || c == '"':
			i = skipString(src, i)
		case strings.HasPrefix(src[i:], closing):
			return i + len(closing)
		default:
			i++
		}
	}
	return len(src)
}

func skipString(src string, i int) int {
	q := src[i]
	for i++; i < len(src); i++ {
		if src[i] == '\\' {
			i++
			continue
		}
		if src[i] == q {
			return i + 1
		}
	}
	return len(src)
}

// lex splits a statement into tokens: names, numbers, string literals
// (kept with their quotes) and operators.
func lex(s string) []string {
	var toks []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '\'' || c == '"':
			j := skipString(s, i)
			toks = append(toks, s[i:j])
			i = j
		case isIdentStart(c) || c >= 0x80:
			j := i + 1
			for j < len(s) && (isIdentStart(s[j]) || (s[j] >= '0' && s[j] <= '9') || s[j] >= 0x80) {
				j++
			}
			toks = append(toks, s[i:j])
			i = j
		case c >= '0' && c <= '9':
			j := i + 1
			for j < len(s) && (s[j] >= '0' && s[j] <= '9' || s[j] == '.' || s[j] == '_') {
				j++
			}
			toks = append(toks, s[i:j])
			i = j
		default:
			if i+1 < len(s) && strings.Contains("** // == != <= >=", s[i:i+2]) && s[i+1] != ' ' {
				toks = append(toks, s[i:i+2])
				i += 2
				continue
			}
			toks = append(toks, s[i:i+1])
			i++
		}
	}
	return toks
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(t string) bool { return t != "" && (isIdentStart(t[0]) || t[0] >= 0x80) }

// parseStatement reads `for target in value` and `set target = value`.
func parseStatement(toks []string) (statement, bool) {
	if len(toks) < 4 {
		return statement{}, false
	}
	var s statement
	var sep string
	switch toks[0] {
	case "for":
		s.loop, sep = true, "in"
	case "set":
		sep = "="
	default:
		return statement{}, false
	}
	k := 1
	for k < len(toks) && toks[k] != sep {
		k++
	}
	if k >= len(toks)-1 {
		return statement{}, false // `{% set x %}…{% endset %}` is a block, not an Assign
	}
	target := toks[1:k]
	s.simple = len(target) == 1 && isIdent(target[0])
	if s.simple {
		s.target = target[0]
	}
	p := &exprParser{toks: toks[k+1:]}
	s.value = p.parse()
	if p.pos < len(p.toks) {
		next := p.toks[p.pos]
		if !(s.loop && (next == "if" || next == "recursive")) {
			s.value = &expr{kind: exprOther}
		}
	}
	return s, true
}

// exprParser reads a unary Jinja expression with its postfix operators,
// filters and tests: exactly the shapes the detection rule distinguishes.
// Whatever follows (a binary operator, a conditional) makes the whole
// expression "other", which the caller sees as unconsumed tokens.
type exprParser struct {
	toks []string
	pos  int
}

func (p *exprParser) peek() string {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return ""
}

func (p *exprParser) next() string {
	t := p.peek()
	p.pos++
	return t
}

func (p *exprParser) parse() *expr {
	e := p.postfix(p.primary())
	for {
		switch p.peek() {
		case "|":
			p.next()
			if !isIdent(p.next()) {
				return &expr{kind: exprOther}
			}
			for p.peek() == "." {
				p.next()
				p.next()
			}
			if p.peek() == "(" {
				p.skipGroup()
			}
			e = p.postfix(&expr{kind: exprFilter, node: e})
		case "is":
			p.next()
			if p.peek() == "not" {
				p.next()
				p.testName()
				return &expr{kind: exprOther} // a negated test is a Not node
			}
			p.testName()
			e = &expr{kind: exprTest, node: e}
		default:
			return e
		}
	}
}

// testName consumes a test's name and its arguments, given in parentheses
// or as one bare primary (`is sameas none`).
func (p *exprParser) testName() {
	p.next()
	for p.peek() == "." {
		p.next()
		p.next()
	}
	switch t := p.peek(); {
	case t == "(":
		p.skipGroup()
	case t == "else" || t == "or" || t == "and" || t == "if" || t == "":
	case isIdent(t) || t[0] == '\'' || t[0] == '"' || (t[0] >= '0' && t[0] <= '9') || t == "[" || t == "{":
		p.postfix(p.primary())
	}
}

func (p *exprParser) primary() *expr {
	t := p.next()
	switch {
	case t == "(":
		inner := p.parse()
		if p.peek() == ")" {
			p.next()
			return inner
		}
		p.skipTo(")")
		return &expr{kind: exprOther}
	case t == "[" || t == "{":
		p.pos--
		p.skipGroup()
		return &expr{kind: exprOther}
	case t == "not" || t == "-" || t == "+":
		p.postfix(p.primary())
		return &expr{kind: exprOther}
	case isIdent(t) && t != "true" && t != "false" && t != "none" &&
		t != "True" && t != "False" && t != "None":
		return &expr{kind: exprName, name: t}
	}
	return &expr{kind: exprOther}
}

func (p *exprParser) postfix(e *expr) *expr {
	for {
		switch p.peek() {
		case ".":
			p.next()
			attr := p.next()
			if isIdent(attr) {
				e = &expr{kind: exprAttr, name: attr, node: e}
			} else {
				e = &expr{kind: exprOther}
			}
		case "[":
			start := p.pos
			p.skipGroup()
			inner := p.toks[start+1 : p.pos-1]
			switch {
			case containsTop(inner, ":"):
				e = &expr{kind: exprSlice, node: e}
			case len(inner) == 1 && len(inner[0]) >= 2 && (inner[0][0] == '\'' || inner[0][0] == '"'):
				e = &expr{kind: exprAttr, name: unquote(inner[0]), node: e}
			default:
				e = &expr{kind: exprOther}
			}
		case "(":
			p.skipGroup()
			e = &expr{kind: exprOther}
		default:
			return e
		}
	}
}

// skipGroup consumes a bracketed group starting at the current token.
func (p *exprParser) skipGroup() {
	depth := 0
	for p.pos < len(p.toks) {
		switch p.next() {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
			if depth == 0 {
				return
			}
		}
	}
}

func (p *exprParser) skipTo(closing string) {
	for p.pos < len(p.toks) && p.next() != closing {
	}
}

// containsTop reports whether tok occurs outside nested brackets.
func containsTop(toks []string, tok string) bool {
	depth := 0
	for _, t := range toks {
		switch t {
		case "(", "[", "{":
			depth++
		case ")", "]", "}":
			depth--
		case tok:
			if depth == 0 {
				return true
			}
		}
	}
	return false
}

// unquote decodes a Jinja string literal's common escapes.
func unquote(lit string) string {
	body := lit[1 : len(lit)-1]
	if !strings.Contains(body, `\`) {
		return body
	}
	r := strings.NewReplacer(`\\`, `\`, `\'`, `'`, `\"`, `"`, `\n`, "\n", `\t`, "\t")
	return r.Replace(body)
}
