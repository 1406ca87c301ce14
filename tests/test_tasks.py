"""HellaSwag, Winogrande and multiple-choice scores: task files read and tasks picked as
llama-perplexity does (its random numbers against libstdc++'s), the batched evaluation against the
numpy reference, and SmolLM2's scores against llama-perplexity's on the same small task files."""

import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel
from llamavk.tasks import hellaswag, multiple_choice, read_task_file, winogrande
from llamavk.cpp_random import MT19937, scaled_index, uniform_index
from llamavk.tasks.evaluate import TaskSequences, evaluate_tasks, plan_batches

from .llamacpp_ref import run_tool


def cli(*args):
    return subprocess.run([sys.executable, "-m", "llamavk", "perplexity", *map(str, args)], capture_output=True,
                          text=True, timeout=900)


# -- task files ----------------------------------------------------------------------------------------

HELLASWAG = """\
Baking: A woman puts flour in a bowl. She
2
sings a song to the moon.
drives a car into the lake.
adds eggs and stirs the mix.
paints the wall blue.
Sports: A man runs onto the field with a ball. He
0
kicks the ball toward the goal.
eats a sandwich slowly.
reads a book about birds.
falls asleep in the grass.
Cooking: The chef slices the onions. Then he
1
flies to the moon.
puts them in the hot pan.
sings loudly to the crowd.
buys a new car.
Music: A girl sits at the piano. She
3
jumps into the pool.
eats the keys.
walks to the store.
plays a simple melody.
Cleaning: A man holds a mop over the floor. He
2
throws the mop at a bird.
sleeps on the couch.
wipes the floor until it shines.
reads the newspaper.
"""

WINOGRANDE = """\
0,Sarah was a much better surgeon than Maria so _ always got the easier cases.,Sarah,Maria,2
1,The cat chased the mouse because _ was hungry.,cat,mouse,1
this line has no commas at all
2,He poured water from the bottle into the cup until _ was full.,bottle,cup,2
3,"The ice melted in the sun because _ was hot, very hot.",ice,sun,2
4,The dog barked at the mailman because _ was scared.,dog,mailman,1
5,No blank here.,a,b,1
6,The bird sat on the _.,branch,soup,1
7,The apple fell on the boy and _ started crying.,apple,boy, 2
8,The glass broke when it hit the floor because _ was fragile.,glass,floor,1
9,The last line is not read: _ is dropped.,it,that,1
"""

MULTIPLE_CHOICE = [
    ("What color is the sky on a clear day?", ["Blue.", "Green.", "Purple.", "Red."], [1, 0, 0, 0]),
    ("How many legs does a dog have?", ["Four.", "Seven.", "Twelve."], [1, 0, 0]),
    ("What do bees make?", ["Honey.", "Steel.", "Plastic bags.", "Glass.", "Concrete."], [1, 0, 0, 0, 0]),
    ("Which animal says moo?", ["The cow.", "The fish."], [1, 0]),
    ("What is frozen water called?", ["Ice.", "Sand.", "Smoke."], [0, 0, 1]),
]


def mc_bytes(tasks) -> bytes:
    """llama.cpp's binary multiple-choice layout, written from its definition."""
    def string(s):
        b = s.encode()
        return struct.pack("<I", len(b)) + b

    def answer_set(answers, labels):
        return (struct.pack("<I", len(answers)) + b"".join(string(a) for a in answers)
                + struct.pack(f"<{len(labels)}i", *labels))

    blobs = [string(q) + answer_set(a, l) + answer_set(a[:2], [1, 1]) for q, a, l in tasks]
    offsets, pos = [], 4 + 4 * len(blobs)
    for b in blobs:
        offsets.append(pos)
        pos += len(b)
    return struct.pack(f"<{len(blobs) + 1}I", len(blobs), *offsets) + b"".join(blobs)


# -- llama-perplexity's random numbers --------------------------------------------------------------------

def test_mt19937_known_value():
    """The C++ standard's check: the 10000th draw of a default-constructed std::mt19937."""
    rng = MT19937()
    for _ in range(9999):
        rng()
    assert rng() == 4123659995


CPP = r"""
#include <random>
#include <cstdio>
int main() {
    std::mt19937 rng(1);
    size_t ns[] = {1, 2, 3, 6, 7, 100, 10042, 3000000000UL, 4294967295UL};
    for (int r = 0; r < 30; ++r)
        for (size_t n : ns) { std::uniform_int_distribution<size_t> d(0, n - 1); printf("%zu\n", d(rng)); }
    std::mt19937 r2(1);
    float scale = 1.f / (1.f + (float) std::mt19937::max());
    for (int r = 0; r < 100; ++r) printf("%d\n", (int) (scale * r2() * (size_t) (1 + r * 53)));
}
"""


def test_task_draws_match_libstdcxx(tmp_path):
    """uniform_index and scaled_index against a program built with the system's g++ (libstdc++)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: libstdc++'s uniform_int_distribution cannot be run here")
    (tmp_path / "r.cpp").write_text(CPP)
    subprocess.run([gxx, "-O1", "-o", str(tmp_path / "r"), str(tmp_path / "r.cpp")], check=True)
    want = [int(v) for v in subprocess.run([str(tmp_path / "r")], capture_output=True, text=True,
                                           check=True).stdout.split()]
    rng = MT19937(1)
    got = [uniform_index(rng, n) for _ in range(30) for n in (1, 2, 3, 6, 7, 100, 10042, 3000000000, 4294967295)]
    r2 = MT19937(1)
    got += [scaled_index(r2, 1 + r * 53) for r in range(100)]
    assert got == want


# -- reading task files ------------------------------------------------------------------------------------

def test_hellaswag_file():
    tasks = hellaswag.parse(HELLASWAG)
    assert len(tasks) == 5 and tasks[1] == ("Sports: A man runs onto the field with a ball. He", 0,
                                            ["kicks the ball toward the goal.", "eats a sandwich slowly.",
                                             "reads a book about birds.", "falls asleep in the grass."])
    assert hellaswag.parse(HELLASWAG.rstrip("\n")) == tasks          # -f drops the final line break
    # all tasks, drawn in random order (llama-perplexity always draws)
    assert sorted(t[1] for t in hellaswag.select(tasks, 400)) == sorted(t[1] for t in tasks)
    with pytest.raises(LlamavkError, match="6 lines per task; this one has 31 lines"):
        hellaswag.parse(HELLASWAG + "one more\n")
    with pytest.raises(LlamavkError, match="task 2: line 8 .'zero'. is not an ending index"):
        hellaswag.parse(HELLASWAG.replace("\n0\n", "\nzero\n"))


def test_winogrande_file():
    notes = []
    tasks = winogrande.parse(WINOGRANDE.rstrip("\n"), notes.append)
    assert len(tasks) == 8                      # 11 lines: 2 malformed, the last not read
    assert tasks[3] == ("The ice melted in the sun because ", " was hot, very hot.", ["ice", "sun"], 2)  # unquoted
    assert tasks[6][3] == 2                     # " 2": leading space, as C++'s >> reads it
    assert notes == ["load_winogrande_from_csv: failed to find comma separators in <this line has no commas at all>",
                     "load_winogrande_from_csv: no _ in <No blank here.>"]
    assert winogrande.parse(WINOGRANDE, notes.append)[-1][2] == ["it", "that"]   # a file ending in an empty line
    assert winogrande.parse("0,a _ b,x,y,3\n1,a _ c,x,y,1\n", notes.append) == [("a ", " c", ["x", "y"], 1)]
    assert notes[-1] == "load_winogrande_from_csv: failed to parse answer <3>"


def test_multiple_choice_file(tmp_path):
    data = mc_bytes(MULTIPLE_CHOICE)
    tasks = multiple_choice.load(data, 0, lambda s: None)
    assert tasks == MULTIPLE_CHOICE
    assert multiple_choice.load(data, 9, lambda s: None) == MULTIPLE_CHOICE      # more than there are: all
    picked = multiple_choice.load(data, 3, lambda s: None)        # read at their offsets
    assert len(picked) == 3 and all(t in MULTIPLE_CHOICE for t in picked) and len({t[0] for t in picked}) == 3
    path = tmp_path / "mc.bin"
    path.write_bytes(data + b"\n")
    assert read_task_file(path, binary=True) == data + b"\n"        # as is (llama-perplexity's -bf)
    for bad, message in ((data[:-3], "ends inside task 5's second answer set's labels"),
                         (struct.pack("<I", 0), "no multiple-choice tasks"),
                         (struct.pack("<3I", 1, 8, 1) + b"Q" + struct.pack("<I", 101), "task 1's answers has 101")):
        with pytest.raises(LlamavkError, match=message):
            multiple_choice.load(bad, 0, lambda s: None)
    stray = data[:4 + 4 * 5 + 4] + b"\xff" + data[4 + 4 * 5 + 5:]     # a byte that is not UTF-8: kept, as llama.cpp
    question = multiple_choice.load(stray, 0, lambda s: None)[0][0]
    assert question[0] == "\udcff" and question[1:] == MULTIPLE_CHOICE[0][0][1:]


# -- batched evaluation ---------------------------------------------------------------------------------------

def test_plan_batches():
    assert plan_batches([5, 3, 4, 9, 2], 12) == [(0, 2, 5), (2, 1, 4), (3, 1, 9), (4, 1, 2)]
    assert plan_batches([3, 3, 3, 3], 12) == [(0, 4, 3)]
    with pytest.raises(LlamavkError, match="a sequence of 13 tokens does not fit the context of 12"):
        plan_batches([3, 13], 12)


@pytest.mark.parametrize("split", [None, "layer"])
def test_batched_log_probs_equal_the_reference(synthetic_model, split):
    """Sequences of different lengths packed several per batch (padded, a partial padding sequence
    at the end, batches read in slices of n_batch rows) give each query the log-probability the
    numpy reference computes for that sequence alone; also split over two virtual devices (layer
    mode pipelines a slice's micro-batches)."""
    path = synthetic_model("llama", "q8_0")
    rng = np.random.default_rng(4)
    tasks = []
    for n_seq in (4, 2, 3, 1):
        seqs = [[1] + [int(t) for t in rng.integers(3, 500, rng.integers(5, 21))] for _ in range(n_seq)]
        queries = [(s, j, int(rng.integers(0, 500))) for s in range(n_seq) for j in range(0, len(seqs[s]), 3)]
        tasks.append(TaskSequences(seqs, queries))
    ref = ReferenceModel(load_model_file(path))
    split_args = dict(devices="Vulkan0,Vulkan0", split_mode=split) if split else {}
    with llamavk.load(path, n_ctx=64, n_batch=24, n_ubatch=8, warn=lambda m: None, **split_args) as m:
        assert m.split_mode == (split or "none")
        calls = []

        def eval_rows(tokens, n_past, seq_len):
            calls.append((len(tokens), n_past, seq_len))
            return m.runtime.eval("all", tokens, n_past, seq_len=seq_len)

        got = list(evaluate_tasks(eval_rows, tasks, budget=64, n_batch=24))
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert any(seq_len > 0 for _, _, seq_len in calls) and any(n_past > 0 for _, n_past, _ in calls)
    for (i, lp), task in zip(got, tasks):
        want = []
        for s, j, target in task.queries:
            x = ref.logits(task.sequences[s][:j + 1])[-1].astype(np.float64)
            want.append(x[target] - x.max() - np.log(np.exp(x - x.max()).sum()))
        np.testing.assert_allclose(lp, want, atol=2e-3, err_msg=f"task {i}")


# -- the command line (tiny model) ---------------------------------------------------------------------------

def test_cli_task_scores_and_errors(synthetic_model, tmp_path):
    model = synthetic_model("llama", "q8_0")
    hs = tmp_path / "hs.txt"
    hs.write_text(HELLASWAG)
    r = cli("-m", model, "-f", hs, "--hellaswag", "--hellaswag-tasks", "2", "-c", "64")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[:2] == ["", "task\tacc_norm\t95% confidence interval"] and lines[2].startswith("1\t")
    assert lines[3].startswith("2\t") and lines[4:] == ["", "", ""]
    with llamavk.load(model, n_ctx=256, n_batch=256, warn=lambda m: None) as m:
        out = []
        score = m.hellaswag(hs, 2, emit=out.append)
    assert out == lines[:5] and score.n_tasks == 2 and len(score.scores[0]) == 4

    mc = tmp_path / "mc.bin"
    mc.write_bytes(mc_bytes(MULTIPLE_CHOICE))
    r = cli("-m", model, "-bf", mc, "--multiple-choice", "-c", "64")
    assert r.returncode == 0, r.stderr
    assert [l.split("\t")[0] for l in r.stdout.split("\n")[2:7]] == ["1", "2", "3", "4", "5"]
    assert "Final result: " in r.stdout and "Random chance: " in r.stdout

    def one_line_error(r, code, text):
        assert r.returncode == code and "Traceback" not in r.stderr, r.stderr
        errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
        assert len(errors) == 1 and text in errors[0], r.stderr

    one_line_error(cli("-m", model, "--hellaswag"), 2, "give the hellaswag task file with -f FILE")
    one_line_error(cli("-m", model, "-f", hs, "--hellaswag", "--winogrande"), 2, "give one of")
    one_line_error(cli("-m", model, "-f", tmp_path / "none.txt", "--winogrande"), 2, "cannot read")
    hs.write_text(HELLASWAG + "x\n")
    one_line_error(cli("-m", model, "-f", hs, "--hellaswag"), 1, "6 lines per task")
    mc.write_bytes(mc_bytes(MULTIPLE_CHOICE)[:-1])
    one_line_error(cli("-m", model, "-f", mc, "--multiple-choice"), 1, "ends inside task 5")
    long = tmp_path / "long.csv"
    long.write_text("0,The " + "very " * 200 + "_ end.,a,b,1\n\n")
    one_line_error(cli("-m", model, "-f", long, "--winogrande", "-c", "32"), 1, "does not fit the context of 128")


# -- SmolLM2 against llama-perplexity ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    """SmolLM2 loaded as `llamavk perplexity -c 128` loads it for task scores (context 4 x 128)."""
    with llamavk.load(smollm2_path, n_ctx=512, n_batch=512, warn=lambda m: None) as m:
        yield m


def llamacpp_lines(model, n_tasks: int, *args, final: str | None = None) -> list[str]:
    """llama-perplexity's (CPU) result lines: those that start with a task number, then its final
    lines. Rerun where its logging thread lost lines at exit (see llamacpp_ref.run_tool_until)."""
    for _ in range(5):
        out = run_tool("llama-perplexity", "-m", model, "-c", 128, "-ngl", 0, "-t", 2, *args)
        lines = [l for l in out.splitlines() if l[:1].isdigit() and "\t" in l]
        finals = [l.split(" I ", 1)[1] for l in out.splitlines() if " I Final " in l or " I Random chance" in l]
        if len(lines) == n_tasks and (final is None or any(f.startswith(final) for f in finals)):
            return lines + finals
    raise AssertionError(f"llama-perplexity's task lines are incomplete:\n{out[-3000:]}")


def test_smollm2_hellaswag_equals_llamacpp(smollm2, smollm2_path, tmp_path):
    """3 tasks drawn from 5: the same tasks in the same order, the same acc_norm lines. Margins
    between the best and second ending (llamavk, SmolLM2): 1.06 nats or more."""
    path = tmp_path / "hs.txt"
    path.write_text(HELLASWAG)
    out = []
    score = smollm2.hellaswag(path, 3, emit=out.append)
    want = llamacpp_lines(smollm2_path, 3, "-f", path, "--hellaswag", "--hellaswag-tasks", 3)
    print(out, [sorted(s)[-1] - sorted(s)[-2] for s in score.scores])
    assert [l for l in out if l[:1].isdigit()] == want and score.n_tasks == 3


def test_smollm2_winogrande_equals_llamacpp(smollm2, smollm2_path, tmp_path):
    """All 8 usable tasks, and 3 drawn at random: the same tasks (their scores identify them), the
    same choices and accuracies; the scores themselves within 0.25. llama.cpp's CPU build rounds
    activations to 8 bits, differently for different batch shapes: measured up to 0.17 from
    llamavk's (which are within 1e-3 of the float numpy reference), and its own scores move by up to
    0.19 between -np 4 (its default, used here) and -np 8. The bird task scores its choice word:
    there llama-perplexity takes the second choice's first log-probability from the logits after
    the first sentence's last token (-15.5 for "soup" after "...branch."), and so does llamavk."""
    path = tmp_path / "wg.csv"
    path.write_text(WINOGRANDE)
    for n in (0, 3):
        out = []
        score = smollm2.winogrande(path, n, emit=out.append)
        want = llamacpp_lines(smollm2_path, 8 if n == 0 else n, "-f", path, "--winogrande", "--winogrande-tasks", n)
        got = [l for l in out if l[:1].isdigit()]
        assert len(got) == len(want) == score.n_tasks == (8 if n == 0 else 3)
        for g, w in zip(got, want):
            gf, wf = g.split(), w.split()
            assert (gf[0], gf[1], gf[4], gf[5]) == (wf[0], wf[1], wf[4], wf[5]), (g, w)
            assert [float(v) for v in gf[2:4]] == pytest.approx([float(v) for v in wf[2:4]], abs=0.25), (g, w)


def test_smollm2_multiple_choice_equals_llamacpp(smollm2, smollm2_path, tmp_path):
    """3 tasks of 5 drawn at random (read at their offsets; 2 to 5 answers): the same accuracy
    lines, final result and random chance."""
    path = tmp_path / "mc.bin"
    path.write_bytes(mc_bytes(MULTIPLE_CHOICE))
    out = []
    score = smollm2.multiple_choice(path, 3, emit=out.append)
    want = llamacpp_lines(smollm2_path, 3, "-bf", path, "--multiple-choice", "--multiple-choice-tasks", 3,
                          "-np", 8, final="Random chance")     # -np 8: room for 5 answers
    assert [l for l in out if l[:1].isdigit() or l.startswith(("Final", "Random"))] == want
    assert score.n_tasks == 3 and score.random_chance == pytest.approx(100 * 3 / sum(len(s) for s in score.scores))
