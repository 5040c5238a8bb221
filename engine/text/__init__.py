"""Texts before they are decoded: normalisation (`normalize`: numbers, money, dates as words)
and long texts cut into chunks that fit one decode (`sentences`: where a text may be cut;
`chunks`: whether a text fits and how it is cut; `join`: the chunks' codes and audio put back
into one row). Imports no torch."""
