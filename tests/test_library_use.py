"""The README's "From Python" example, run as a reader would copy it (on the tiny Adult fixture,
for a few steps): the library without ``train`` must train, report and decode as documented."""
import re
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"
ADULT = Path(__file__).parent / "fixtures" / "adult_tiny"


def readme_example() -> str:
    section = README.read_text().split("## From Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_library_example_trains_within_its_target_and_decodes_the_table(monkeypatch):
    """Only the data's size is changed: the fixture's 41 rows take a batch of 8, a few steps and a
    table of 40 rows."""
    monkeypatch.setenv("LIGHTNING_DPGAN_DATA_DIR", str(ADULT))
    code = readme_example()
    for full, tiny in (("batch_size=500", "batch_size=8"), ("StepLimit(4400)", "StepLimit(3)"),
                       ("model.sample(30162)", "model.sample(40)")):
        assert code.count(full) == 1, full
        code = code.replace(full, tiny)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 -- the documented example itself
    report, data, synthetic = namespace["report"], namespace["data"], namespace["synthetic"]
    assert report["steps"] == 3 and report["epsilon"] <= 1.0
    assert report["preprocessing"]["epsilon"] == pytest.approx(0.1)  # the mode histogram's share, composed in
    assert list(synthetic.columns) == list(data.train_frame.columns) and len(synthetic) == 40
    assert 0.0 <= namespace["scores"]["utility/B_auroc"] <= 1.0


def test_a_ctgan_module_built_without_a_table_layout_is_told_the_library_remedy_too():
    """The message named only train's --data.encoding, which a script has no use for."""
    from lightning_dpgan.modules.dpctgan import DPCTGAN

    with pytest.raises(ValueError, match=r"--data.encoding mode-specific \(from Python: the datamodule's "
                                         r"encoding='mode-specific', and the module's table_layout=datamodule.table_layout\)"):
        DPCTGAN((12,), None)


@pytest.mark.parametrize("strategy", ["DPSGD", "PATEAggregation", "ProjectedVoting", "GradientSanitizer"])
def test_a_strategys_report_asked_for_before_fit_says_it_has_nothing_to_report_yet(strategy):
    """DPSGD's crashed in an AttributeError on its missing mechanism (others reported empty
    figures, train_records None): a strategy a Trainer has not set up has nothing to report."""
    from lightning_dpgan import callbacks

    unfitted = getattr(callbacks, strategy)(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(RuntimeError, match=rf"{strategy}.privacy_report\(\): the strategy has not been set up by a "
                                           r"Trainer yet.*call it after trainer.fit"):
        unfitted.privacy_report()
