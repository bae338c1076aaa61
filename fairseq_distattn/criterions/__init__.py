"""The plugin's fairseq criteria, registered on import (with the models, by the
package's import hook): ``answer_cross_entropy``, the loss of the decoder-only
length-generalization tasks (:mod:`.answer_cross_entropy`)."""

from . import answer_cross_entropy  # noqa: F401 (registers the criterion)
