"""Plausible generated prose in several languages, for the synthetic document corpus.

Contract: ``paragraph(rng, language, words)`` returns sentences of at least ``words`` words in
``language`` (one of ``LANGUAGES``), built from hand-written per-language phrase lists
(subject, verb, object, adverbial, connector), so a language identifier sees real function
words and morphology. Everything is drawn from the given ``random.Random``: same seed, same
text. Characters stay within Latin-1, which the PDF core fonts can encode.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Phrasebook:
    """Phrase lists of one language; a sentence is [connector] subject verb object [adverbial]."""

    subjects: tuple[str, ...]
    verbs: tuple[str, ...]
    objects: tuple[str, ...]
    adverbials: tuple[str, ...]
    connectors: tuple[str, ...]
    title_prefix: str


PHRASEBOOKS: dict[str, Phrasebook] = {
    "en": Phrasebook(
        subjects=("the committee", "our team", "the regional office", "the new supplier", "the board of directors", "each department",
                  "the auditor", "the project manager", "the research group", "the city council", "a small working group",
                  "the finance department", "the engineering team", "the customer service desk", "the annual survey"),
        verbs=("reviews", "approves", "reports", "recommends", "describes", "updates", "examines", "publishes", "confirms",
               "postpones", "summarises", "compares", "requests", "evaluates", "prepares"),
        objects=("the quarterly budget", "a detailed proposal", "the maintenance schedule", "the revised contract", "the sales figures",
                 "several open questions", "the safety guidelines", "a list of priorities", "the final report", "the energy costs",
                 "the training programme", "the delivery times", "the staff survey results", "the product roadmap", "the risk register"),
        adverbials=("before the end of the month", "in the next quarter", "after a long discussion", "with some reservations",
                    "for the second time this year", "without further delay", "in close cooperation with the partners",
                    "as agreed in the last meeting", "during the spring session", "at the request of the members"),
        connectors=("However,", "In addition,", "As a result,", "Meanwhile,", "For this reason,", "In practice,", "Nevertheless,"),
        title_prefix="Report on",
    ),
    "de": Phrasebook(
        subjects=("der Ausschuss", "unser Team", "die Regionalstelle", "der neue Lieferant", "der Vorstand", "jede Abteilung",
                  "die Prüferin", "der Projektleiter", "die Forschungsgruppe", "der Stadtrat", "eine kleine Arbeitsgruppe",
                  "die Finanzabteilung", "das Entwicklungsteam", "der Kundendienst", "die jährliche Umfrage"),
        verbs=("prüft", "genehmigt", "meldet", "empfiehlt", "beschreibt", "aktualisiert", "untersucht", "veröffentlicht", "bestätigt",
               "verschiebt", "fasst zusammen", "vergleicht", "beantragt", "bewertet", "bereitet vor"),
        objects=("den Quartalshaushalt", "einen ausführlichen Vorschlag", "den Wartungsplan", "den überarbeiteten Vertrag",
                 "die Verkaufszahlen", "mehrere offene Fragen", "die Sicherheitsrichtlinien", "eine Liste der Prioritäten",
                 "den Abschlussbericht", "die Energiekosten", "das Schulungsprogramm", "die Lieferzeiten",
                 "die Ergebnisse der Mitarbeiterbefragung", "die Produktplanung", "das Risikoregister"),
        adverbials=("vor dem Ende des Monats", "im nächsten Quartal", "nach einer langen Diskussion", "mit einigen Vorbehalten",
                    "zum zweiten Mal in diesem Jahr", "ohne weitere Verzögerung", "in enger Zusammenarbeit mit den Partnern",
                    "wie in der letzten Sitzung vereinbart", "während der Frühjahrssitzung", "auf Wunsch der Mitglieder"),
        connectors=("Allerdings", "Außerdem", "Deshalb", "Inzwischen", "Aus diesem Grund", "In der Praxis", "Dennoch"),
        title_prefix="Bericht über",
    ),
    "fr": Phrasebook(
        subjects=("le comité", "notre équipe", "le bureau régional", "le nouveau fournisseur", "le conseil d'administration",
                  "chaque service", "l'auditrice", "le chef de projet", "le groupe de recherche", "le conseil municipal",
                  "un petit groupe de travail", "le service financier", "l'équipe technique", "le service client", "l'enquête annuelle"),
        verbs=("examine", "approuve", "signale", "recommande", "décrit", "met à jour", "étudie", "publie", "confirme", "reporte",
               "résume", "compare", "demande", "évalue", "prépare"),
        objects=("le budget trimestriel", "une proposition détaillée", "le calendrier de maintenance", "le contrat révisé",
                 "les chiffres de vente", "plusieurs questions ouvertes", "les consignes de sécurité", "une liste de priorités",
                 "le rapport final", "les coûts de l'énergie", "le programme de formation", "les délais de livraison",
                 "les résultats de l'enquête", "la feuille de route du produit", "le registre des risques"),
        adverbials=("avant la fin du mois", "au prochain trimestre", "après une longue discussion", "avec quelques réserves",
                    "pour la deuxième fois cette année", "sans plus attendre", "en étroite collaboration avec les partenaires",
                    "comme convenu lors de la dernière réunion", "pendant la session de printemps", "à la demande des membres"),
        connectors=("Cependant,", "De plus,", "Par conséquent,", "Entre-temps,", "Pour cette raison,", "En pratique,", "Néanmoins,"),
        title_prefix="Rapport sur",
    ),
    "es": Phrasebook(
        subjects=("el comité", "nuestro equipo", "la oficina regional", "el nuevo proveedor", "la junta directiva", "cada departamento",
                  "la auditora", "el jefe de proyecto", "el grupo de investigación", "el ayuntamiento", "un pequeño grupo de trabajo",
                  "el departamento financiero", "el equipo de ingeniería", "el servicio de atención al cliente", "la encuesta anual"),
        verbs=("revisa", "aprueba", "informa sobre", "recomienda", "describe", "actualiza", "examina", "publica", "confirma", "aplaza",
               "resume", "compara", "solicita", "evalúa", "prepara"),
        objects=("el presupuesto trimestral", "una propuesta detallada", "el calendario de mantenimiento", "el contrato revisado",
                 "las cifras de ventas", "varias preguntas abiertas", "las normas de seguridad", "una lista de prioridades",
                 "el informe final", "los costes de la energía", "el programa de formación", "los plazos de entrega",
                 "los resultados de la encuesta", "la hoja de ruta del producto", "el registro de riesgos"),
        adverbials=("antes de fin de mes", "en el próximo trimestre", "después de una larga discusión", "con algunas reservas",
                    "por segunda vez este año", "sin más demora", "en estrecha colaboración con los socios",
                    "según lo acordado en la última reunión", "durante la sesión de primavera", "a petición de los miembros"),
        connectors=("Sin embargo,", "Además,", "Como resultado,", "Mientras tanto,", "Por esta razón,", "En la práctica,", "No obstante,"),
        title_prefix="Informe sobre",
    ),
}

LANGUAGES: tuple[str, ...] = tuple(PHRASEBOOKS)


def sentence(rng: random.Random, language: str) -> str:
    """One sentence in ``language``."""
    book = PHRASEBOOKS[language]
    parts = []
    if rng.random() < 0.25:
        parts.append(rng.choice(book.connectors))
    subject = rng.choice(book.subjects)
    parts += [subject, rng.choice(book.verbs), rng.choice(book.objects)]
    if rng.random() < 0.6:
        parts.append(rng.choice(book.adverbials))
    text = " ".join(parts)
    return text[0].upper() + text[1:] + "."


def paragraph(rng: random.Random, language: str, words: int) -> str:
    """Sentences totalling at least ``words`` words."""
    if language not in PHRASEBOOKS:
        raise ValueError(f"unknown language {language!r}; choose one of {list(LANGUAGES)}")
    out: list[str] = []
    count = 0
    while count < words:
        s = sentence(rng, language)
        out.append(s)
        count += len(s.split())
    return " ".join(out)


def title(rng: random.Random, language: str) -> str:
    book = PHRASEBOOKS[language]
    return f"{book.title_prefix} {rng.choice(book.objects)}"
