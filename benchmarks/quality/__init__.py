"""How good? Models trained with one recipe per task and scored: translation on
Multi30k En-De (:mod:`.mt`, with the papers' ablations as configurations,
:mod:`.ablations`) and language models on WikiText-2 (:mod:`.lm`), then the same models
on longer inputs than they were trained on (:mod:`.mt_extrapolation`,
:mod:`.lm_extrapolation`).
"""
