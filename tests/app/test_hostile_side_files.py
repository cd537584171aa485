"""The main job's side files and inputs against a hostile file system: COST_TABLE written
through a fresh temporary (never a link planted beside it) and read back only from a regular
file of bounded size; --input_file a folder or a remote path named; a very long prompt shown
shortened (results.jsonl keeps it whole)."""
import json
import os

from tests.app.test_hostile_clis import many

TINY = "--gin_file=runs/random_tiny.gin"  # a random-init tiny T5 pair (no checkpoint)
AUTO = ["--gin.GAMMA_POLICY='auto'", "--gin.MAX_NEW_TOKENS=4", "--gin.BATCH_SIZE=1",
        "--gin.TIMING_REPEATS=1", "--plain"]


def test_cost_table_side_file_is_never_written_through_a_link(tmp_path, capfd):
  # The table went through a fixed COST_TABLE.tmp that followed symlinks: a link planted
  # there made the job overwrite its target.
  precious = tmp_path / "precious.txt"
  precious.write_text("mine")
  table = tmp_path / "costs.json"
  (tmp_path / "costs.json.tmp").symlink_to(precious)
  table.symlink_to(tmp_path / "nowhere.json")  # a dangling link under the name itself
  long_prompt = "word " * 1000  # 5,000 characters
  [(status, errors)] = many("specjax.app.main", [[
      TINY, "--prompt", long_prompt, f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'",
      f"--gin.COST_TABLE='{table}'", *AUTO]])
  assert status == 0 and not errors
  shown = many.stdout[0]  # the trace echoes the prompt shortened: head, note, tail
  assert "word word … [4000 characters not shown] … word word" in " ".join(shown.split())
  assert long_prompt not in shown
  assert precious.read_text() == "mine" and not (tmp_path / "nowhere.json").exists()
  assert not table.is_symlink() and json.loads(table.read_text())["version"] >= 1
  assert sorted(p.name for p in tmp_path.iterdir()) == [
      "costs.json", "costs.json.tmp", "out", "precious.txt"]  # no temporary left behind
  record = json.loads((tmp_path / "out" / "results.jsonl").read_text().splitlines()[0])
  assert record["input"] == long_prompt  # kept whole


def test_hostile_cost_tables_and_input_files_are_named(tmp_path, monkeypatch):
  # A FIFO as the table hung the job; /dev/zero was read without limit; an --input_file
  # folder was named as 'file descriptor 3'; gs:// paths "did not exist". gs:// is read in
  # place now: here its endpoint is a closed port on 127.0.0.1, so it cannot be reached.
  from specjax.testing_gcs import free_port  # pylint: disable=import-outside-toplevel
  monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", f"http://127.0.0.1:{free_port()}")
  monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "none")
  monkeypatch.setenv("SPECJAX_GCS_RETRIES", "0")
  fifo = tmp_path / "fifo.json"
  os.mkfifo(fifo)
  zero = tmp_path / "zero.json"
  zero.symlink_to("/dev/zero")
  out = f"--gin.OUTPUT_DIR='{tmp_path / 'out'}'"
  results = many("specjax.app.main", [
      [TINY, "--prompt", "x", out, f"--gin.COST_TABLE='{fifo}'", *AUTO],
      [TINY, "--prompt", "x", out, f"--gin.COST_TABLE='{zero}'", *AUTO],
      [TINY, "--input_file", str(tmp_path), out],
      [TINY, "--input_file", "gs://bucket/prompts.txt", out],
      ["--gin_file=runs/decode.gin", "--prompt", "x", out,
       "--gin.TARGET_CHECKPOINT='gs://bucket/t5_xxl'", "--gin.DRAFT_CHECKPOINT='/ckpt/small'",
       "--gin.TARGET_MODEL='models/t5_1_1_small.gin'", "--gin.VOCABULARY='bundled:specjax_8k'",
       "--gin.DRAFT_MODEL='models/t5_1_1_small.gin'"]])
  assert [s for s, _ in results] == [2, 2, 2, 2, 2]
  assert results[0][1] == [f"specjax: error: cost table '{fifo}' cannot be read: the file "
                           f"{fifo} is a FIFO, not a regular file; refusing to read it"]
  assert "is a character device, not a regular file" in results[1][1][0]
  assert results[2][1] == [f"specjax: error: --input_file {tmp_path} is a folder, not a regular "
                           "file; refusing to read it"]
  assert len(results[3][1]) == 1 and results[3][1][0].startswith(
      "specjax: error: cannot read --input_file gs://bucket/prompts.txt: the storage server "
      "cannot be reached")
  assert len(results[4][1]) == 1 and results[4][1][0].startswith(
      "specjax: error: cannot look up gs://bucket/t5_xxl") and "cannot be reached" in \
      results[4][1][0]
