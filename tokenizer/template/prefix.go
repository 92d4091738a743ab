package template

import (
	"strings"
	"unicode/utf8"
)

// Multimodal requests: the engine expands each image, audio or video part
// into tokens only the model's processor knows, so the router can key only
// the prompt text that comes before the first such part. TextPrefix marks
// where that text ends.
//
// Method: the message holding the first non-text part has its whole
// content replaced by sentinel text, twice: once one short sentinel, once
// a longer one (as two text parts in the openai format, so list lengths
// differ too), and the template is rendered each time. TextPrefix is the
// smallest of: the first sentinel's offset in its render, the length of
// the two renders' common prefix, and the length of the common prefix with
// the real Prompt. Text before the message's content is then the same
// whatever that content is, as far as three different contents show.
//
// Limits: a template whose output before a message depends on that
// message's content in a way none of the three contents reveal (say, a
// system line printed only when some later message mentions an image) can
// still fool it; a template that drops or rewrites the sentinel yields 0,
// which is safe (nothing is routed on). In vLLM's "string" content format
// the model's placeholder for the part is unknown here, so Prompt past
// TextPrefix is only an approximation there; in the "openai" format it is
// exact ({"type": "image"} and so on, as vLLM passes them).

// Sentinels are ASCII without whitespace or template syntax, so no trim
// or escaping touches them; the two start with different bytes and differ
// in length and part count.
var (
	sentinelA = []string{"KVROUTEMEDIAxQ7vZ"}
	sentinelB = []string{"zz9pkvroutemediaNzz9pk", "vroutemediaNzz9pkvroutemediaN"}
)

func (r *renderer) textPrefix(conv conversation, prompt string) int {
	a, ok := r.renderWithSentinel(conv, sentinelA)
	if !ok {
		return 0
	}
	b, ok := r.renderWithSentinel(conv, sentinelB)
	if !ok {
		return 0
	}
	at := strings.Index(a, sentinelA[0])
	if at < 0 {
		return 0
	}
	n := min(at, commonPrefix(a, b), commonPrefix(a, prompt))
	// Never cut inside a UTF-8 sequence.
	for n > 0 && n < len(prompt) && !utf8.RuneStart(prompt[n]) {
		n--
	}
	return n
}

// renderWithSentinel renders the conversation with the first multimodal
// message's content replaced by the sentinel parts, in the content format
// the template takes (joined with "\n" in the string format, as vLLM joins
// text parts).
func (r *renderer) renderWithSentinel(conv conversation, parts []string) (string, bool) {
	messages := deepCopy(conv.messages).([]any)
	msg := messages[conv.media].(*object)
	role, _ := msg.get("role")
	if r.v.openai && role != "tool" {
		list := make([]any, len(parts))
		for i, p := range parts {
			list[i] = textPart(p)
		}
		msg.set("content", list)
	} else {
		msg.set("content", strings.Join(parts, "\n"))
	}
	// continue_final_message would cut at the final message's text; the
	// sentinel render must show everything the template prints.
	saved := r.cont
	r.cont = false
	out, err := r.render(messages)
	r.cont = saved
	return out, err == nil
}

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
