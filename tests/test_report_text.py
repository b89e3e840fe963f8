"""What the reproduction's text says beside its numbers: check cells, the settings table, the
experiment list of `ratrain reproduce --help` (no experiment runs)."""
from ratrain.repro.experiment import Check, Experiment, Settings, format_checks
from ratrain.repro.report import EXPERIMENT_NAMES, catalog, experiments_help, write_report


def _experiment() -> Experiment:
    return Experiment("demo", "Demo", [{"x": 1}],
                      [Check("with a paper value", 1.23456, 1.2, "±0.1", True),
                       Check("no paper value", 3, None, "-", True)])


def test_empty_paper_cells_read_as_a_dash(tmp_path):
    table = format_checks(_experiment()).splitlines()
    assert "None" not in "\n".join(table)
    assert table[2].split()[-4:] == ["3", "-", "-", "pass"]
    report = write_report([_experiment()], tmp_path, Settings()).read_text()
    assert "| no paper value | 3 | - | - | pass |" in report and "None" not in report


def test_settings_are_a_small_table(tmp_path):
    report = write_report([_experiment()], tmp_path, Settings()).read_text()
    assert "| setting | value |" in report and "| ratrain_zero_stages | 0, 1, 2 |" in report
    assert "| platform | mt3000 (every field: `settings.platform` in each experiment's JSON) |" in report
    assert max(map(len, report.splitlines())) < 200        # no line-long dict


def test_reproduce_help_lists_every_experiment_with_a_line_and_a_cost():
    assert tuple(catalog()) == EXPERIMENT_NAMES
    lines = experiments_help().splitlines()[1:]
    assert [line.split()[0] for line in lines] == list(EXPERIMENT_NAMES)
    assert all(entry.summary and "min" in entry.cost for entry in catalog().values())
