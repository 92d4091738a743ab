package lru_test

import (
	"container/list"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/internal/lru"
)

// TestAgainstContainerList drives a List and a container/list model with
// the same random operations and compares the order after each.
func TestAgainstContainerList(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	l := lru.New[int, int]()
	model := list.New()
	elems := map[int]*list.Element{} // linked keys
	held := map[int]bool{}           // every key, linked or not
	for step := range 20_000 {
		k := r.IntN(64)
		id, ok := l.Lookup(k)
		if ok != held[k] {
			t.Fatalf("step %d: Lookup(%d) = %v, model %v", step, k, ok, held[k])
		}
		switch op := r.IntN(4); {
		case !ok:
			id = l.Add(k, k*10)
			held[k] = true
			if op < 2 {
				l.PushFront(id)
				elems[k] = model.PushFront(k)
			}
		case op == 0:
			l.PushFront(id)
			if e, in := elems[k]; in {
				model.MoveToFront(e)
			} else {
				elems[k] = model.PushFront(k)
			}
		case op == 1:
			l.Unlink(id)
			if e, in := elems[k]; in {
				model.Remove(e)
				delete(elems, k)
			}
		case op == 2:
			if got := *l.Value(id); got != k*10 {
				t.Fatalf("step %d: Value(%d) = %d, want %d", step, k, got, k*10)
			}
			l.Delete(id)
			delete(held, k)
			if e, in := elems[k]; in {
				model.Remove(e)
				delete(elems, k)
			}
		default:
			if b, ok := l.Back(); ok {
				bk := l.Key(b)
				if want := model.Back().Value.(int); bk != want {
					t.Fatalf("step %d: Back = %d, want %d", step, bk, want)
				}
			} else if model.Len() != 0 {
				t.Fatalf("step %d: Back empty, model has %d", step, model.Len())
			}
		}
		if l.Len() != len(held) || l.Linked() != model.Len() {
			t.Fatalf("step %d: Len %d Linked %d, want %d %d", step, l.Len(), l.Linked(), len(held), model.Len())
		}
	}
}
