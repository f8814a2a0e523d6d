"""Functions the lenbench task YAMLs name with ``!function utils.<fn>``.

lm-eval imports this file by path, so it only forwards to ``bench.harness.tasks`` (the module
beside this folder), where the data builders live and are tested.
"""

from bench.harness.tasks import passkey_dataset as _passkey_dataset
from bench.harness.tasks import passkey_process_results as _passkey_process_results
from bench.harness.tasks import perplexity_dataset as _perplexity_dataset


def passkey_dataset(**metadata):
    """custom_dataset of lenbench_passkey_<L>: {"test": Dataset} built locally from the metadata."""
    return _passkey_dataset(**metadata)


def passkey_process_results(doc, results):
    """acc (starts with " <key>") and acc_parsed (first integer == key) of one generation."""
    return _passkey_process_results(doc, results)


def perplexity_dataset(**metadata):
    """custom_dataset of lenbench_ppl_<L>: {"test": Dataset} of held-out documents cut to L bytes."""
    return _perplexity_dataset(**metadata)


def ruler_dataset(**metadata):
    """custom_dataset of lenbench_ruler_<task>: {"test": Dataset} built locally from the metadata."""
    from bench.harness.tasks import ruler_dataset as _ruler_dataset

    return _ruler_dataset(**metadata)


def ruler_process_results(doc, results):
    """acc (the whole answer, then no letter or digit) and match (RULER's string_match_all)."""
    from bench.harness.tasks import ruler_process_results as _ruler_process_results

    return _ruler_process_results(doc, results)


def count(items):
    """Aggregation of the ruler tasks' n_<L> metrics: the documents scored at length L."""
    from bench.harness.tasks import count as _count

    return _count(items)
