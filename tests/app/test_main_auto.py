"""The main job's 'auto' settings: a bad COST_TABLE is refused before any model loads."""
import pytest

from specjax import app as main


@pytest.mark.parametrize("policy, path, message", [
    ("constant", "costs.json", "cost_table is for gamma_policy='auto'"),
    ("auto", "missing_folder/costs.json", "does not exist"),
    ("auto", "broken.json", "cannot be read"),
    ("sometimes", None, "gamma_policy must be one of"),
])
def test_bad_auto_settings_fail_first(tmp_path, policy, path, message):
  (tmp_path / "broken.json").write_text("{")
  cost_table = str(tmp_path / path) if path else None
  with pytest.raises(ValueError, match=message):
    main.decode_job(["a text"], gamma_policy=policy, cost_table=cost_table,
                    output_dir=str(tmp_path / "out"))
