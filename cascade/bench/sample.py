"""The request sample the benchmarks (and tests) use by default: 260 labelled decision requests.

One JSON object per line in the evaluation format: ``{"id", "source", "state", "questions":
{qid: {type, instructions, criteria?}}, "gold": {qid: label | true/false | level}}``; state
lengths from one line to several thousand tokens, choice questions with 2 to 77 options, noul.
Converted from public data sets (choice criteria map label keys to readable descriptions):

- banking77, 60 items: PolyAI-LDN/task-specific-datasets, ``banking_data/test.csv``
  (Casanueva et al. 2020), CC BY 4.0;
- boolq, 60: the BoolQ dev split (Clark et al. 2019), CC BY-SA 3.0;
- bfcl, 60: ShishirPatil/gorilla, BFCL v4 ``multiple`` and ``live_multiple``, Apache-2.0;
- when2call, 40: NVIDIA/When2Call, ``data/test/when2call_test_llm_judge.jsonl``, Apache-2.0;
- sms_spam, 40: the UCI SMS Spam Collection v.1 (Almeida and Gómez Hidalgo), CC BY 4.0.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE = Path(__file__).with_name("requests-sample.jsonl")
