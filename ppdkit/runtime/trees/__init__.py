"""The trees a step verifies, and their sizing: dynamic sparse trees, grown trees and their fitted values, the
layout as one input sequence, pruning, and the latency profile that sizes them on this machine."""
