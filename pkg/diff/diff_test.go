package diff

import (
	"errors"
	"strings"
	"testing"
)

const gitTwoFiles = `diff --git a/cart/total.go b/cart/total.go
index 3b18e51..a1c2d3f 100644
--- a/cart/total.go
+++ b/cart/total.go
@@ -1,3 +1,5 @@
 package cart
 
-func Total() int { return 0 }
+// Total sums the lines.
+func Total(lines []int) int { return sum(lines) }
+
@@ -10,3 +12,3 @@ func sum(xs []int) int {
 	s := 0
-	for _, x := range xs { s += x }
+	for _, x := range xs { s = s + x }
 	return s
diff --git a/web/price.ts b/web/price.ts
index 1111111..2222222 100644
--- a/web/price.ts
+++ b/web/price.ts
@@ -3,2 +3,3 @@ export function price() {
   const a = 1;
+  const b = 2;
   return a;
`

const newFile = `diff --git a/docs/NOTES.md b/docs/NOTES.md
new file mode 100644
index 0000000..e69de29
--- /dev/null
+++ b/docs/NOTES.md
@@ -0,0 +1,2 @@
+# Notes
+first line
`

const deletedFile = `diff --git a/old/legacy.py b/old/legacy.py
deleted file mode 100644
index e69de29..0000000
--- a/old/legacy.py
+++ /dev/null
@@ -1,2 +0,0 @@
-def legacy():
-    pass
`

const noNewline = `diff --git a/VERSION b/VERSION
--- a/VERSION
+++ b/VERSION
@@ -1 +1 @@
-1.0.0
\ No newline at end of file
+1.0.1
\ No newline at end of file
`

const plainPair = `--- a/a.txt	2024-01-01 00:00:00
+++ b/a.txt	2024-01-02 00:00:00
@@ -1,2 +1,2 @@
 keep
-old
+new
--- a/b.txt
+++ b/b.txt
@@ -5,0 +6,1 @@
+tail
`

type wantFile struct {
	path, oldPath string
	deleted       bool
	hunks         int
	added         []Line
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr string // substring; "" means success
		files   []wantFile
	}{
		{
			name: "git two files, multiple hunks",
			in:   gitTwoFiles,
			files: []wantFile{
				{path: "cart/total.go", oldPath: "cart/total.go", hunks: 2, added: []Line{
					{Kind: Added, Text: "// Total sums the lines.", NewLine: 3},
					{Kind: Added, Text: "func Total(lines []int) int { return sum(lines) }", NewLine: 4},
					{Kind: Added, Text: "", NewLine: 5},
					{Kind: Added, Text: "\tfor _, x := range xs { s = s + x }", NewLine: 13},
				}},
				{path: "web/price.ts", oldPath: "web/price.ts", hunks: 1, added: []Line{
					{Kind: Added, Text: "  const b = 2;", NewLine: 4},
				}},
			},
		},
		{
			name: "new file from /dev/null",
			in:   newFile,
			files: []wantFile{{path: "docs/NOTES.md", oldPath: "docs/NOTES.md", hunks: 1, added: []Line{
				{Kind: Added, Text: "# Notes", NewLine: 1},
				{Kind: Added, Text: "first line", NewLine: 2},
			}}},
		},
		{
			name:  "deleted file keeps its old path",
			in:    deletedFile,
			files: []wantFile{{path: "old/legacy.py", oldPath: "old/legacy.py", deleted: true, hunks: 1}},
		},
		{
			name: "no newline at end of file marker",
			in:   noNewline,
			files: []wantFile{{path: "VERSION", oldPath: "VERSION", hunks: 1, added: []Line{
				{Kind: Added, Text: "1.0.1", NewLine: 1},
			}}},
		},
		{
			name: "plain ---/+++ pairs with timestamps",
			in:   plainPair,
			files: []wantFile{
				{path: "a.txt", oldPath: "a.txt", hunks: 1, added: []Line{{Kind: Added, Text: "new", NewLine: 2}}},
				{path: "b.txt", oldPath: "b.txt", hunks: 1, added: []Line{{Kind: Added, Text: "tail", NewLine: 6}}},
			},
		},
		{
			name: "CRLF line endings",
			in:   strings.ReplaceAll(newFile, "\n", "\r\n"),
			files: []wantFile{{path: "docs/NOTES.md", oldPath: "docs/NOTES.md", hunks: 1, added: []Line{
				{Kind: Added, Text: "# Notes", NewLine: 1},
				{Kind: Added, Text: "first line", NewLine: 2},
			}}},
		},
		{name: "empty input", in: "", wantErr: "no file sections"},
		{name: "prose only", in: "LGTM, ship it\n", wantErr: "no file sections"},
		{
			name:    "malformed hunk header",
			in:      "--- a/x\n+++ b/x\n@@ -1,2 +1,two @@\n a\n",
			wantErr: "bad hunk range",
		},
		{
			name:    "hunk header missing closing @@",
			in:      "--- a/x\n+++ b/x\n@@ -1,2 +1,2\n a\n",
			wantErr: "malformed hunk header",
		},
		{
			name:    "hunk shorter than its header",
			in:      "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n b",
			wantErr: "ends early",
		},
		{
			name:    "hunk with more removals than its header",
			in:      "--- a/x\n+++ b/x\n@@ -1,1 +1,2 @@\n-a\n-b\n+c\n",
			wantErr: "more lines than its header",
		},
		{
			name:    "unexpected marker inside hunk",
			in:      "--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n a\n*b\n",
			wantErr: "must start with",
		},
		{
			name:    "hunk before any file header",
			in:      "@@ -1 +1 @@\n-a\n+b\n",
			wantErr: "hunk before file header",
		},
		{
			name:    "+++ without ---",
			in:      "+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
			wantErr: "+++ without ---",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := Parse(tt.in)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("Parse succeeded, want error containing %q", tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %q, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if len(d.Files) != len(tt.files) {
				t.Fatalf("got %d files, want %d", len(d.Files), len(tt.files))
			}
			for i, w := range tt.files {
				f := d.Files[i]
				if f.Path != w.path || f.OldPath != w.oldPath || f.Deleted != w.deleted || len(f.Hunks) != w.hunks {
					t.Errorf("file %d = {%q %q deleted=%v hunks=%d}, want {%q %q deleted=%v hunks=%d}",
						i, f.Path, f.OldPath, f.Deleted, len(f.Hunks), w.path, w.oldPath, w.deleted, w.hunks)
				}
				got := f.Added()
				if len(got) != len(w.added) {
					t.Fatalf("file %s: %d added lines %+v, want %d", f.Path, len(got), got, len(w.added))
				}
				for j := range got {
					if got[j] != w.added[j] {
						t.Errorf("file %s added[%d] = %+v, want %+v", f.Path, j, got[j], w.added[j])
					}
				}
			}
		})
	}
}

func TestParseEmptyIsErrEmpty(t *testing.T) {
	if _, err := Parse("just words"); !errors.Is(err, ErrEmpty) {
		t.Fatalf("err = %v, want ErrEmpty", err)
	}
}

func TestHunkLinesAndRemovedHaveNoNewLine(t *testing.T) {
	d, err := Parse(gitTwoFiles)
	if err != nil {
		t.Fatal(err)
	}
	h := d.File("cart/total.go").Hunks[1]
	if h.OldStart != 10 || h.OldLines != 3 || h.NewStart != 12 || h.NewLines != 3 {
		t.Fatalf("hunk header = %+v", h)
	}
	want := []Line{
		{Kind: Context, Text: "\ts := 0", NewLine: 12},
		{Kind: Removed, Text: "\tfor _, x := range xs { s += x }"},
		{Kind: Added, Text: "\tfor _, x := range xs { s = s + x }", NewLine: 13},
		{Kind: Context, Text: "\treturn s", NewLine: 14},
	}
	if len(h.Lines) != len(want) {
		t.Fatalf("lines = %+v", h.Lines)
	}
	for i := range want {
		if h.Lines[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, h.Lines[i], want[i])
		}
	}
}

func TestFileLookup(t *testing.T) {
	d, err := Parse(gitTwoFiles)
	if err != nil {
		t.Fatal(err)
	}
	if d.File("web/price.ts") == nil {
		t.Error("File(web/price.ts) = nil")
	}
	for _, p := range []string{"price.ts", "b/web/price.ts", "", "cart/missing.go"} {
		if d.File(p) != nil {
			t.Errorf("File(%q) != nil", p)
		}
	}
}

func TestInHunk(t *testing.T) {
	d, err := Parse(gitTwoFiles)
	if err != nil {
		t.Fatal(err)
	}
	f := d.File("cart/total.go")
	// Hunks cover new lines 1-5 and 12-14.
	tests := []struct {
		n    int
		want bool
	}{
		{0, false}, {1, true}, {3, true}, {5, true}, {6, false}, {11, false},
		{12, true}, {14, true}, {15, false}, {-1, false}, {1000, false},
	}
	for _, tt := range tests {
		if got := f.InHunk(tt.n); got != tt.want {
			t.Errorf("InHunk(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
	del, err := Parse(deletedFile)
	if err != nil {
		t.Fatal(err)
	}
	// A deleted file's hunk has no new lines at all.
	if f := del.File("old/legacy.py"); f.InHunk(0) || f.InHunk(1) {
		t.Error("deleted file reports lines in hunk")
	}
}

func TestContains(t *testing.T) {
	d, err := Parse(gitTwoFiles)
	if err != nil {
		t.Fatal(err)
	}
	f := d.File("cart/total.go")
	tests := []struct {
		text string
		want bool
	}{
		{"func Total(lines []int) int", true},
		{"   s = s + x   ", true},                 // trimmed before matching
		{"for _, x := range xs { s += x }", true}, // removed lines are diff text too
		{"return s", true},                        // context lines count
		{"package cart", true},
		{"", false},
		{"   \t ", false},
		{"const b = 2;", false}, // other file
		{"func Total() int { return 1 }", false},
		{"s := 0\n\tfor", false}, // never spans lines
	}
	for _, tt := range tests {
		if got := f.Contains(tt.text); got != tt.want {
			t.Errorf("Contains(%q) = %v, want %v", tt.text, got, tt.want)
		}
	}
}

func TestAddedEmptyForDeletion(t *testing.T) {
	d, err := Parse(deletedFile)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Files[0].Added(); len(got) != 0 {
		t.Fatalf("Added() = %+v, want none", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		gitTwoFiles, newFile, deletedFile, noNewline, plainPair,
		"", "--- a/x\n+++ b/x\n@@ -1,2 +1,two @@\n a\n",
		"--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n b",
		"--- a/x\n+++ b/x\n@@ -1,1 +1,2 @@\n-a\n-b\n+c\n",
		"@@ -1 +1 @@\n-a\n+b\n",
		"diff --git a/x b/x\n--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s)
		if err != nil {
			if d != nil {
				t.Fatalf("error %v with non-nil diff", err)
			}
			return
		}
		if len(d.Files) == 0 {
			t.Fatal("success with no files")
		}
		for i := range d.Files {
			f := &d.Files[i]
			for _, h := range f.Hunks {
				var olds, news int
				for _, l := range h.Lines {
					switch l.Kind {
					case Added:
						news++
					case Removed:
						olds++
					case Context:
						olds++
						news++
					default:
						t.Fatalf("line kind %q", l.Kind)
					}
				}
				// Parse refuses hunks that do not add up, so every accepted
				// hunk must match its header exactly.
				if olds != h.OldLines || news != h.NewLines {
					t.Fatalf("hunk %+v holds %d old, %d new lines", h, olds, news)
				}
				// Huge starts overflow the line counter; only check sane ones.
				if h.NewStart < 1<<30 {
					for _, l := range h.Lines {
						if l.Kind != Removed && !f.InHunk(l.NewLine) {
							t.Fatalf("line %+v not InHunk", l)
						}
					}
				}
			}
			for _, l := range f.Added() {
				if strings.TrimSpace(l.Text) != "" && !f.Contains(l.Text) {
					t.Fatalf("added line %q not Contained", l.Text)
				}
			}
		}
	})
}
