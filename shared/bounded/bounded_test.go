package bounded

import (
	"sync"
	"testing"
)

func TestMapBound(t *testing.T) {
	m := New[int, string](3)
	for i := range 10 {
		m.Put(i, "v")
		if m.Len() > 3 {
			t.Fatalf("after %d puts: %d entries, bound 3", i+1, m.Len())
		}
	}
	m.Put(9, "again") // an existing key evicts nothing
	if v, ok := m.Get(9); !ok || v != "again" || m.Len() != 3 {
		t.Fatalf("Get(9) = %q, %v; len %d", v, ok, m.Len())
	}
	m.Delete(9)
	if _, ok := m.Get(9); ok || m.Len() != 2 {
		t.Fatalf("after Delete: len %d", m.Len())
	}
	if z := New[string, int](0); z.max != 1 {
		t.Fatalf("bound 0 gave %d", z.max)
	}
}

func TestMapConcurrent(t *testing.T) {
	m := New[int, int](50)
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				m.Put(g*1000+i, i)
				m.Get(g*1000 + i - 1)
				if i%3 == 0 {
					m.Delete(g*1000 + i)
				}
			}
		}()
	}
	wg.Wait()
	if m.Len() > 50 {
		t.Fatalf("%d entries, bound 50", m.Len())
	}
}
