package sim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"assay.dev/pkg/model"
)

// A noisy model's answers to one input differ from call to call; the
// draws start again with Reseed, give the same answers for the same seed
// in any order of calls, and other answers for another seed. A model that
// is not noisy answers the same every time.
func TestNoisyModelFollowsSeed(t *testing.T) {
	s, base := start(t)
	url := base + "/v1/chat/completions"
	ask := func(modelName string) string {
		req := chatReq(ContractCodeReview, "acme", diffInput(testDiff))
		req.Model = modelName
		var out struct{ Findings []CodeFinding }
		if err := json.Unmarshal([]byte(content(t, mustDo(t, "POST", url, req))), &out); err != nil {
			t.Fatal(err)
		}
		var at []string
		for _, f := range out.Findings {
			at = append(at, fmt.Sprintf("%s:%d", f.File, f.Line))
		}
		return strings.Join(at, ",")
	}
	const calls = 24
	inOrder := func(seed uint64, modelName string) []string {
		s.Reseed(seed)
		var out []string
		for range calls {
			out = append(out, ask(modelName))
		}
		return out
	}
	noisy := NoisyModel(50)
	first := inOrder(7, noisy)
	if distinct := slices.Compact(slices.Sorted(slices.Values(first))); len(distinct) < 3 {
		t.Fatalf("a noisy model gave %d distinct answers in %d calls: %q", len(distinct), calls, first)
	}
	if again := inOrder(7, noisy); !slices.Equal(again, first) {
		t.Fatalf("the same seed drew other answers:\n%q\n%q", first, again)
	}
	if other := inOrder(8, noisy); slices.Equal(other, first) {
		t.Fatalf("another seed drew the same answers: %q", other)
	}
	// Concurrent calls draw the same answers, in some order.
	s.Reseed(7)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var together []string
	for range calls {
		wg.Go(func() {
			a := ask(noisy)
			mu.Lock()
			together = append(together, a)
			mu.Unlock()
		})
	}
	wg.Wait()
	if !slices.Equal(slices.Sorted(slices.Values(together)), slices.Sorted(slices.Values(first))) {
		t.Fatalf("concurrent calls drew other answers:\n%q\n%q", together, first)
	}
	if steady := slices.Compact(inOrder(7, DefaultModel)); len(steady) != 1 || steady[0] == "" {
		t.Fatalf("the simulated reviewer changed its answer: %q", steady)
	}
	if all := slices.Compact(inOrder(7, NoisyModel(0))); len(all) != 1 || all[0] != slices.Compact(inOrder(7, DefaultModel))[0] {
		t.Fatalf("a noisy model at 0%% dropped something: %q", all)
	}
	if none := slices.Compact(inOrder(7, NoisyModel(100))); len(none) != 1 || none[0] != "" {
		t.Fatalf("a noisy model at 100%% kept something: %q", none)
	}
}

// At 100% a noisy model drops all it can of the other contracts' answers:
// a change review keeps one tag and no finding, at severity low; a
// moderation verdict reads the text as harmless.
func TestNoisyModelOtherContracts(t *testing.T) {
	_, base := start(t)
	url := base + "/v1/chat/completions"
	change := chatReq(ContractChangeReview, "acme", diffInput(testDiff))
	change.Model = NoisyModel(100)
	var ch ChangeReview
	decodeStrict(t, content(t, mustDo(t, "POST", url, change)), &ch)
	if len(ch.Tags) != 1 || len(ch.Findings) != 0 || ch.Severity != "low" {
		t.Errorf("change review at 100%%: %+v", ch)
	}
	text, _ := json.Marshal(map[string]string{"text": "I want to die."})
	mod := chatReq(ContractModeration, "acme", string(text))
	mod.Model = NoisyModel(100)
	var m Moderation
	decodeStrict(t, content(t, mustDo(t, "POST", url, mod)), &m)
	if m != harmless {
		t.Errorf("moderation at 100%%: %+v", m)
	}
}

// The prompt directives reach every contract: no findings makes a change
// review empty at severity low, flag nothing makes a moderation verdict
// harmless, and add notes puts a property no schema allows into any answer.
func TestDirectivesEveryContract(t *testing.T) {
	_, base := start(t)
	url := base + "/v1/chat/completions"
	text, _ := json.Marshal(map[string]string{"text": "You are a pathetic idiot."})
	ask := func(contract, input, prompt string) map[string]any {
		t.Helper()
		req := chatReq(contract, "acme", input)
		req.Messages = model.Messages(prompt, model.Correlation{WorkID: "w_1", SchemaVersion: json.RawMessage(`"1"`)}, "", json.RawMessage(input))
		var out map[string]any
		if err := json.Unmarshal([]byte(content(t, mustDo(t, "POST", url, req))), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if ch := ask(ContractChangeReview, diffInput(testDiff), "Assess the change."); ch["severity"] != "high" {
		t.Fatalf("change review without directives: %v", ch)
	}
	if ch := ask(ContractChangeReview, diffInput(testDiff), "Assess the change.\n"+DirectiveNoFindings); ch["severity"] != "low" ||
		len(ch["findings"].([]any)) != 0 || len(ch["tags"].([]any)) == 0 {
		t.Errorf("change review told to report nothing: %v", ch)
	}
	if m := ask(ContractModeration, string(text), "Moderate."); m["category"] != CategoryAbuse {
		t.Fatalf("moderation without directives: %v", m)
	}
	if m := ask(ContractModeration, string(text), "Moderate.\n"+DirectiveFlagNothing); m["category"] != CategoryOther || m["needsHumanReview"] != false {
		t.Errorf("moderation told to flag nothing: %v", m)
	}
	for contract, input := range map[string]string{ContractCodeReview: diffInput(testDiff), ContractChangeReview: diffInput(testDiff),
		ContractModeration: string(text)} {
		if a := ask(contract, input, "Answer.\n"+DirectiveAddNotes); a["notes"] == nil {
			t.Errorf("%s told to add notes: %v", contract, a)
		}
	}
}
