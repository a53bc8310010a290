"""The process one GGUF runs in under llama.cpp for the bench (bench/llama_cpp.py starts it; run as a script, so
that it imports llama-cpp-python and nothing of ppdkit or PyTorch).

Why a process of its own: llama.cpp shares nothing with the bench then. In the bench's process its AMX kernels
lost their tiles to oneDNN's (SIGILL, seen), and a crash of llama.cpp (a segmentation fault on a CI machine: pip had
reused a cached GCC build of its AMX kernels) killed the bench's process with no word of what had crashed; here it
ends this process alone, and the bench stops with an error that names llama.cpp and the file.

Protocol, one JSON object per line: argv[1] holds the settings; the first line written says
{"eos": ..., "system": ...} once the model is loaded; then each line read, {"ids": [...], "max_new_tokens": N},
is answered with {"tokens": [...]}: greedy new tokens up to N or the end token (kept, as ppdkit keeps it).
End of input ends the process.
"""

import json
import os
import sys


def serve(settings: dict) -> None:
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # whatever llama.cpp prints stays out of the replies
    from llama_cpp import Llama, llama_print_system_info
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    lookup = settings["lookup_tokens"]
    draft = LlamaPromptLookupDecoding(num_pred_tokens=lookup) if lookup else None
    llm = Llama(model_path=settings["path"], n_ctx=settings["context"], n_threads=settings["threads"],
                n_threads_batch=settings["threads"], draft_model=draft, verbose=False)
    eos = llm.token_eos()
    system = llama_print_system_info().decode(errors="replace").strip(" |\n")
    replies.write(json.dumps({"eos": eos, "system": system}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        tokens: list[int] = []
        llm.reset()  # else it keeps the KV cache of a prefix shared with the last call, evaluates the prompt in
        # other batches and, its kernels not being row-invariant, can answer otherwise (seen: a repeat that differed)
        for token in llm.generate(request["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                  reset=True):
            tokens.append(token)
            if token == eos or len(tokens) >= request["max_new_tokens"]:
                break
        replies.write(json.dumps({"tokens": tokens}) + "\n")
    llm.close()  # now, not in llama-cpp-python's finalizer at interpreter exit, which can fail noisily


if __name__ == "__main__":
    sys.path.pop(0)  # this script's folder, jobs/: its llama_cpp.py would stand in for llama-cpp-python's package
    serve(json.loads(sys.argv[1]))
