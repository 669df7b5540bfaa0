"The five methods of the book, each a chapter, on the plug-in protocol of `methods.base`."
from .base import *
from .ala import *
from .dcml import *
from .hdml import *
from .dmml import *
from .pads import *
