"""Uncertainty Atlas dashboard (placeholder until the dashboard lands)."""

import streamlit as st

st.set_page_config(page_title="Uncertainty Atlas", layout="wide")
st.title("Uncertainty Atlas")
st.write("The dashboard is being built. Use `python -m gpcore --help` for the headless tools.")
