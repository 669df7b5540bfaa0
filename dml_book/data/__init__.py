"Datasets: built-in (no download) and the real benchmarks as their archives extract."
from .builtin import *
