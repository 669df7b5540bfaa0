"Every loss of the book, one call convention: `loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None, *, weights=None)`."
from .base import *
from .triplet import *
from .pair import *
from .proxy import *
