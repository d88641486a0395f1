"""Reference cases for the Split pre-tokenizer's five delimiter behaviours, with and without
invert: the pieces PyPI `tokenizers` gives for a few patterns over texts with delimiters at the
start, the end, in runs and alone. Writes OUT (JSON): [{pattern, behavior, invert, text, pieces}].

    make_split_cases.py OUT
"""
import json
import sys

from tokenizers import Regex, pre_tokenizers

PATTERNS = [r"\s+", r" ", r"[0-9]+", r"a|bb", r"(?:x+)+y|.", r"\p{P}"]
BEHAVIORS = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]
TEXTS = ["", "a", " lead and trail ", "two  spaces   three", "x12y345 67", "aabbbba bb a", "  ", "1 2 3",
         "xxxy xxz", "hi, there! ok.", "\u00e9t\u00e9 12 caf\u00e9\u3000\u65e5\u672c", ",,a,,", "bbbb"]
NAMES = {"removed": "Removed", "isolated": "Isolated", "merged_with_previous": "MergedWithPrevious",
         "merged_with_next": "MergedWithNext", "contiguous": "Contiguous"}

cases = []
for pattern in PATTERNS:
    for behavior in BEHAVIORS:
        for invert in (False, True):
            split = pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert)
            for text in TEXTS:
                pieces = [p for p, _ in split.pre_tokenize_str(text)]
                cases.append({"pattern": pattern, "behavior": NAMES[behavior], "invert": invert, "text": text,
                              "pieces": pieces})
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(cases, f, ensure_ascii=False)
print(len(cases), "cases")
